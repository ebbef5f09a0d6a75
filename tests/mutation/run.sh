#!/bin/sh
# `make mutation`: mutmut over the backend's core modules, each with the
# test files that exercise it in-process (mutmut picks, for each mutant,
# the tests that reach its function), in a scratch copy
# (build/mutation/MODULE; the checkout is never touched).  MODULES picks
# modules, JOBS the parallelism, SAMPLE=N (SEED=S) N of each module's
# mutants picked at random.
# Each module's score goes to build/mutation/MODULE/score.json and its
# surviving mutants to build/mutation/MODULE/survivors.txt.
set -eu
top=$(pwd)
mutmut=$top/.venv/bin/mutmut
for module in ${MODULES:-ledger store theirs state forks parts logfile fileio server service registry spool arguments search export fsck migrate
    redaction/rules redaction/matcher redaction/streams redaction/session redaction/saved scrub relocate idle scan
    usage}; do
  case $module in
    ledger) selection="tests/test_ledger.py tests/test_ledger_validation.py" ;;
    store|state|parts|logfile|fileio) selection="tests/test_store.py tests/test_store_exactly_once.py tests/test_store_contract.py tests/test_store_logfile.py" ;;
    # What other writers did, and the forks it makes: another machine's copy renamed
    # over an open session's files, another writer appending, a sync engine's conflict copies.
    theirs|forks) selection="tests/test_store_sync.py tests/test_store_sync_writers.py tests/test_store.py" ;;
    # The server's rooms (the open sessions, the spool, a call's arguments) are
    # tested through the server, as Emacs meets them.
    server|service|registry|spool|arguments) selection="tests/test_server_wire.py tests/test_server_flush.py tests/test_server_calls.py tests/test_server_serve.py tests/test_server_hostile.py" ;;
    search) selection="tests/test_search.py tests/test_search_live.py tests/test_search_follower.py
      tests/test_search_rebuild.py tests/test_search_recorder.py tests/test_search_searcher.py
      tests/test_search_projection.py" ;;
    # Redaction is met where secrets arrive: the rules themselves, the store and
    # the server that redact what they write, and export.
    redaction/rules|redaction/matcher|redaction/streams|redaction/session) selection="tests/test_redact.py tests/test_store_redaction.py
      tests/test_server_redaction.py tests/test_export_redact.py" ;;
    # A saved session redacted whole: what export, scan and scrub rewrite or list.
    redaction/saved) selection="tests/test_export_redact.py tests/test_scan.py tests/test_scrub.py tests/test_redact.py" ;;
    scrub) selection="tests/test_scrub.py tests/test_scrub_open.py tests/test_side_file_secrets.py tests/test_maintenance_keeps_time.py" ;;
    scan) selection="tests/test_scan.py tests/test_side_file_secrets.py" ;;
    relocate) selection="tests/test_relocate.py tests/test_move.py tests/test_runreport.py tests/test_maintenance_keeps_time.py" ;;
    idle) selection="tests/test_idle.py tests/test_maintenance_keeps_time.py" ;;
    *) selection="tests/test_$module.py" ;;
  esac
  # A module that is a package (search) has every file in it mutated; one file
  # of a package is named PACKAGE/FILE (redaction/rules).
  target=src/magent_store/$module.py
  [ -d "backend/magent_store/$module" ] && target="src/magent_store/$module/*.py"
  dir=build/mutation/$(printf %s "$module" | tr / -)
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r backend "$dir/src"
  cp -r tests "$dir/tests"
  # Some tests read the user-facing text and the Lisp (no secret in them, say).
  cp -r README.md TROUBLESHOOTING.org docs elisp "$dir/"
  rm -rf "$dir"/src/*.egg-info
  selection=$(for f in $selection; do printf '    %s\n' "$f"; done)
  cat > "$dir/setup.cfg" <<CFG
[mutmut]
source_paths=src/magent_store
only_mutate=$target
also_copy=
    README.md
    TROUBLESHOOTING.org
    docs
    elisp
pytest_add_cli_args_test_selection=
$selection
pytest_add_cli_args=
    -p
    no:cacheprovider
    -q
    -x
CFG
  echo "mutation: $module.py against" $selection "(in $dir)"
  # A command a test starts (python -m magent_store) runs the mutant too, and
  # says which functions it reached (tests/mutation/hook/sitecustomize.py).
  mkdir -p "$dir/hits"
  (cd "$dir" && export MAGENT_STORE_MUTATION=1 MAGENT_STORE_MUTATION_HITS="$top/$dir/hits" \
     PYTHONPATH="$top/$dir/mutants/src:$top/tests/mutation/hook${PYTHONPATH:+:$PYTHONPATH}"
   # The mutants are made first, by a run that names no mutant (mutmut stops
   # there), and the table of which test reaches which function is learnt by
   # the next run: learnt in the run that made the mutants, it misses every
   # test run in pytest's own process (that process imports the unmutated
   # backend, mutants/src not existing yet when it started), and each mutant
   # is then run only against the tests that start a command or a backend.
   "$mutmut" run --max-children "${JOBS:-1}" 'no-such-mutant' >run.log 2>&1 || true
   rm -f mutants/mutmut-stats.json
   if [ -n "${SAMPLE:-}" ]; then
     # SAMPLE=N runs N of the module's mutants picked at random (SEED=S).
     picked=$("$mutmut" results --all true 2>/dev/null | "$top/.venv/bin/python" -c '
import random, sys
names = sorted(line.split(":")[0].strip() for line in sys.stdin if "__mutmut_" in line)
print("\n".join(random.Random(int(sys.argv[2])).sample(names, min(int(sys.argv[1]), len(names)))))
' "$SAMPLE" "${SEED:-0}")
     echo "$picked" >sample.txt
     # shellcheck disable=SC2086
     "$mutmut" run --max-children "${JOBS:-1}" $picked >>run.log 2>&1 || true
   else
     "$mutmut" run --max-children "${JOBS:-1}" >>run.log 2>&1 || true
   fi
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
