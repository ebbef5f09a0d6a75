#!/bin/sh
# `make mutation`: mutmut over the backend's core modules, each with the
# test files that exercise it in-process (mutmut picks, for each mutant,
# the tests that reach its function), in a scratch copy
# (build/mutation/MODULE; the checkout is never touched).  MODULES picks
# modules, JOBS the parallelism.
# Each module's score goes to build/mutation/MODULE/score.json and its
# surviving mutants to build/mutation/MODULE/survivors.txt.
set -eu
top=$(pwd)
mutmut=$top/.venv/bin/mutmut
for module in ${MODULES:-ledger store logfile fileio server registry spool arguments search export fsck migrate}; do
  case $module in
    ledger) selection="tests/test_ledger.py tests/test_ledger_validation.py" ;;
    store|logfile|fileio) selection="tests/test_store.py tests/test_store_exactly_once.py tests/test_store_contract.py tests/test_store_logfile.py" ;;
    # The server's rooms (the open sessions, the spool, a call's arguments) are
    # tested through the server, as Emacs meets them.
    server|registry|spool|arguments) selection="tests/test_server_wire.py tests/test_server_flush.py tests/test_server_calls.py tests/test_server_serve.py tests/test_server_hostile.py" ;;
    search) selection="tests/test_search.py tests/test_search_live.py tests/test_search_follower.py
      tests/test_search_rebuild.py tests/test_search_recorder.py tests/test_search_searcher.py
      tests/test_search_projection.py" ;;
    *) selection="tests/test_$module.py" ;;
  esac
  # A module that is a package (search) has every file in it mutated.
  target=src/magent_store/$module.py
  [ -d "backend/magent_store/$module" ] && target="src/magent_store/$module/*.py"
  dir=build/mutation/$module
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r backend "$dir/src"
  cp -r tests "$dir/tests"
  rm -rf "$dir"/src/*.egg-info
  selection=$(for f in $selection; do printf '    %s\n' "$f"; done)
  cat > "$dir/setup.cfg" <<CFG
[mutmut]
source_paths=src/magent_store
only_mutate=$target
pytest_add_cli_args_test_selection=
$selection
pytest_add_cli_args=
    -p
    no:cacheprovider
    -q
    -x
CFG
  echo "mutation: $module.py against" $selection "(in $dir)"
  (cd "$dir" && MAGENT_STORE_MUTATION=1 "$mutmut" run --max-children "${JOBS:-1}" >run.log 2>&1 || true
   "$mutmut" results >survivors.txt 2>&1 || true
   "$mutmut" export-cicd-stats >/dev/null 2>&1 || true
   cp mutants/mutmut-cicd-stats.json score.json 2>/dev/null || true)
  "$top/.venv/bin/python" - "$dir/score.json" "$module" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(f"mutation: {sys.argv[2]}.py: no score (see its run.log)")
checked = s["killed"] + s["survived"] + s.get("timeout", 0) + s.get("no_tests", 0)
print(f"mutation: {sys.argv[2]}.py: {s['killed'] + s.get('timeout', 0)} of {checked} mutants killed "
      f"({100 * (s['killed'] + s.get('timeout', 0)) / max(checked, 1):.1f}%), {s['survived']} survived, "
      f"{s.get('no_tests', 0)} reached by no test")
PY
done
