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
for module in ${MODULES:-ledger store logfile fileio server search export fsck migrate}; do
  case $module in
    ledger) selection="tests/test_ledger.py tests/test_validation.py" ;;
    store|logfile|fileio) selection="tests/test_store.py tests/test_exactly_once.py tests/test_store_contract.py" ;;
    server) selection="tests/test_server.py tests/test_hostile_and_stop.py" ;;
    *) selection="tests/test_$module.py" ;;
  esac
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
only_mutate=src/magent_store/$module.py
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
