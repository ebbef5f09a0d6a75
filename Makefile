# magent-store: every target works on a fresh machine; the ones that need the
# virtualenv build it first.  `make demo` and `make test` are the README's two
# commands.

PYTHON  ?= python3
EMACS   ?= emacs
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: install autoloads emacs-ready syncthing-ready mutation mutation-elisp test test-loaded test-python test-elisp test-live test-magent test-magent-if-available test-emacs30 test-faults test-faults-quick test-fresh demo bench bench-quick bench-migrate bench-search bench-list bench-find bench-start lint clean

# Users load compiled Lisp (package.el byte-compiles what it installs, and
# native-compiles it where Emacs can), so a checkout does too; every file is
# rebuilt when any changes, as one inlines another's functions.
ELISP_SOURCES := $(sort $(wildcard elisp/*.el))
ELISP_COMPILED := $(ELISP_SOURCES:.el=.elc)
NATIVE := (when (and (fboundp 'native-comp-available-p) (native-comp-available-p)) \
  (native-compile (expand-file-name (car command-line-args-left))))

# Order-only: Emacs must be there (emacs-ready installs it), not newer.
$(ELISP_COMPILED): elisp/%.elc: elisp/%.el $(ELISP_SOURCES) | emacs-ready
	$(EMACS) --batch -Q -L elisp --eval '(setq byte-compile-warnings nil)' \
	  -f batch-byte-compile $<
	-$(EMACS) --batch -Q -L elisp --eval "$(NATIVE)" $< >/dev/null 2>&1

install: $(STAMP) $(ELISP_COMPILED)

# elisp/magent-store-loaddefs.el, which magent-store.el loads, from the
# `;;;###autoload' cookies of elisp/*.el (a test checks it is current).
autoloads:
	$(PYTHON) tests/test_elisp_autoloads.py

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# GNU Emacs >= 28 with epc.el (what the tests load under `emacs -Q') and
# package-lint (what `make lint' runs), and yaml.el (magent's runtime needs
# it: the tests of opening a found session in magent).  Root on Debian gets
# them installed; anyone else is told the one command to run (without
# yaml.el only those tests are skipped, loudly, or fail under CI=true).
EMACS_PACKAGES := emacs-nox elpa-epc elpa-package-lint elpa-yaml
EMACS_CHECK := (progn (dolist (d (file-expand-wildcards \
  "/usr/share/emacs/site-lisp/elpa/*-[0-9]*")) (push d load-path)) \
  (kill-emacs (cond ((not (and (version<= "28.1" emacs-version) (locate-library "epc") \
  (locate-library "package-lint"))) 1) ((locate-library "yaml") 0) (t 3))))

emacs-ready:
	@$(EMACS) --batch -Q --eval '$(EMACS_CHECK)' >/dev/null 2>&1; found=$$?; \
	if [ $$found = 0 ]; then :; \
	elif [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null; then \
	  echo "Installing $(EMACS_PACKAGES) (Emacs, epc.el, package-lint, yaml.el) with apt-get"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends $(EMACS_PACKAGES) && \
	  $(EMACS) --batch -Q --eval '$(EMACS_CHECK)'; \
	elif [ $$found = 3 ]; then \
	  echo "*** yaml.el is missing: the tests of opening a found session in magent will be skipped; run:  sudo apt-get install elpa-yaml ***"; \
	else \
	  echo "GNU Emacs >= 28 with epc.el and package-lint is needed; run:  sudo apt-get install $(EMACS_PACKAGES)"; exit 2; \
	fi

# Syncthing (Debian's package), for the test of two machines kept in step
# by it (tests/test_syncthing_pair.py).  Root on Debian gets it installed;
# anyone else is told the command (without it that test is skipped, loudly,
# or fails under CI=true).
syncthing-ready:
	@if command -v syncthing >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null; then \
	  echo "Installing syncthing with apt-get (the test of two machines kept in sync)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends syncthing || \
	  { apt-get update -q && apt-get install -y -q --no-install-recommends syncthing; }; \
	else \
	  echo "*** syncthing is missing: the test of two machines kept in sync will be skipped; run:  sudo apt-get install syncthing ***"; \
	fi

# Every suite, stopping at the first that fails, then one line per suite:
# what it ran, passed, failed and skipped (tests/summary.py), so that a
# skip cannot hide in the middle of the run.  Under CI=true a skip fails it.
TEST_SUITES := lint test-python test-elisp test-live test-magent test-faults-quick test-fuzz-quick
SUMMARY_DIR := build/test-summary
SUITE = $(PY) tests/summary.py run $(SUMMARY_DIR)

test: install
	@rm -rf $(SUMMARY_DIR); status=0; \
	for target in lint test-python test-elisp test-live test-magent-if-available test-faults-quick; do \
	  $(MAKE) --no-print-directory $$target || { status=$$?; break; }; \
	done; \
	$(PY) tests/summary.py report $(SUMMARY_DIR) $(TEST_SUITES) || status=1; \
	exit $$status

# `make test' on a busy machine: one load process per core keeps every core
# busy while it runs, and is stopped when it ends, whatever the ending (CI
# runs this one).  No test may need the machine quiet.
test-loaded: install
	@pids=; for i in $$(seq $$(nproc 2>/dev/null || echo 2)); do \
	  nice -n 0 yes >/dev/null & pids="$$pids $$!"; \
	done; \
	trap 'kill $$pids 2>/dev/null; wait; exit 130' INT TERM HUP; \
	echo "make test-loaded: every core kept busy (load processes$$pids)"; \
	$(MAKE) --no-print-directory test; status=$$?; \
	kill $$pids 2>/dev/null; wait; exit $$status

# The plot extra too, so the plot test runs.
PLOT_STAMP := $(VENV)/.plot-installed
$(PLOT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,plot]'
	touch $@

test-python: install $(PLOT_STAMP) syncthing-ready
	$(SUITE) test-python pytest -- $(PY) -m pytest -q

# Mutation testing (mutmut) of ledger.py, store.py, server.py (and its
# rooms registry.py, spool.py, arguments.py), search/ (every file of it),
# export.py, fsck.py and migrate.py, each against its own test files; scores
# and survivors under build/mutation/ (docs/DEVELOPING.md,
# "Mutation testing").  MODULES="ledger"
# narrows it, JOBS=2 runs two mutants at once.
MUTMUT_STAMP := $(VENV)/.mutmut-installed
$(MUTMUT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet 'mutmut>=3.8,<4'
	touch $@

mutation: install $(MUTMUT_STAMP)
	sh tests/mutation/run.sh

# The same for the Emacs Lisp: operator-level mutants of elisp/*.el, each
# against the Elisp tests and the tests against upstream magent that reach
# its function (recorded in one run of both), two at a time, in scratch
# copies under build/mutation/elisp/.  SAMPLE=N tries N of them, picked at
# random (SEED=S); see docs/DEVELOPING.md for running some again by name.
mutation-elisp: install emacs-ready
	$(PY) tests/mutation/elisp.py $(if $(SAMPLE),--sample $(SAMPLE)) $(if $(SEED),--seed $(SEED))

# Every tests/elisp/*-tests.el runs here; tests against upstream magent's own
# code live in tests/elisp/upstream/ and run with `make test-magent'.  They are
# loaded by `require' (each provides its file name): a test file may require
# another, and Emacs 30's ERT refuses a test file loaded twice.
# A test that runs longer than MAGENT_STORE_ERT_LIMIT seconds (60) fails with
# its name instead of hanging the run (tests/elisp/magent-store-ert-runner.el);
# one that loops without ever waiting is stopped by tests/summary.py.
# No native compilation starts while tests run: it would compete with them and
# leave its temporary files behind when Emacs exits first.
ELISP_TESTS := $(sort $(wildcard tests/elisp/*-tests.el))
UPSTREAM_TESTS := $(sort $(wildcard tests/elisp/upstream/*-tests.el))
ERT = $(EMACS) --batch -Q -L elisp -L tests/elisp \
  --eval '(setq native-comp-deferred-compilation nil native-comp-jit-compilation nil)' \
  --eval '(setq magent-store-test-python "$(abspath $(VENV))/bin/magent-store")' \
  -l tests/elisp/magent-store-ert-runner.el

test-elisp: install emacs-ready
	$(SUITE) test-elisp ert -- $(ERT) \
	  $(foreach t,$(ELISP_TESTS),--eval "(require '$(basename $(notdir $(t))))") \
	  -f magent-store-ert-run-batch-and-exit

# Upstream magent's own code, pinned: the release in $(UPSTREAM) (a tarball,
# extracted for the run) and the schema-7 magent-session.el in its schema7/.
# MAGENT_LISP (its lisp/ folder) and MAGENT_SESSION7 name other copies.
UPSTREAM ?= $(abspath ../shared/upstream)
UPSTREAM_TARBALL = $(firstword $(wildcard $(UPSTREAM)/magent-*.tar.gz))
UPSTREAM_SESSION7 = $(if $(wildcard $(UPSTREAM)/schema7/magent-session.el),$(UPSTREAM)/schema7)

test-magent: install emacs-ready
	@lisp='$(MAGENT_LISP)'; session7='$(or $(MAGENT_SESSION7),$(UPSTREAM_SESSION7))'; \
	if [ -z "$$lisp" ]; then \
	  if [ -z '$(UPSTREAM_TARBALL)' ]; then \
	    echo "make test-magent: upstream magent not found: no magent-*.tar.gz in $(UPSTREAM), and MAGENT_LISP is not set (see docs/DEVELOPING.md)"; exit 2; \
	  fi; \
	  tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/magent-upstream.XXXXXX") || exit 2; \
	  trap 'rm -rf "$$tmp"' EXIT; trap 'exit 130' INT TERM; \
	  tar -xzf '$(UPSTREAM_TARBALL)' -C "$$tmp" || exit 2; \
	  lisp=$$tmp/lisp; \
	fi; \
	echo "upstream magent: $${lisp}$${session7:+, schema 7: $$session7}"; \
	MAGENT_LISP=$$lisp MAGENT_SESSION7=$$session7 \
	$(SUITE) test-magent ert -- $(ERT) -L tests/elisp/upstream \
	  $(foreach t,$(UPSTREAM_TESTS),--eval "(require '$(basename $(notdir $(t))))") \
	  -f magent-store-ert-run-batch-and-exit

# Without a copy of upstream magent the tests against it are skipped, loudly;
# under CI=true that fails the run.
test-magent-if-available:
	@if [ -n "$(MAGENT_LISP)" ] || [ -n '$(UPSTREAM_TARBALL)' ]; then $(MAKE) --no-print-directory test-magent; \
	elif [ "$$(echo "$${CI:-}" | tr A-Z a-z)" = true ] || [ "$${CI:-}" = 1 ] || [ "$$(echo "$${CI:-}" | tr A-Z a-z)" = yes ]; then \
	  echo "make test: FAILED: upstream magent not found (no magent-*.tar.gz in $(UPSTREAM), MAGENT_LISP not set): under CI every test must run"; exit 2; \
	else $(SUITE) test-magent skipped -- echo "*** SKIPPED: the tests against upstream magent (no magent-*.tar.gz in $(UPSTREAM), MAGENT_LISP not set; see docs/DEVELOPING.md) ***"; fi

# A real Emacs streams through the shim while its backend is SIGKILLed, its
# disk fills, a second Emacs writes the same session; strangers fuzz the port;
# upstream magent saves sessions while each history tool rewrites them.
test-faults: install emacs-ready
	$(PY) tests/faults/faults.py
	$(PY) tests/faults/fuzz.py
	$(PY) tests/faults/tool_race.py

test-faults-quick: install emacs-ready
	$(SUITE) test-faults-quick faults -- $(PY) tests/faults/faults.py --quick
	$(SUITE) test-fuzz-quick faults -- $(PY) tests/faults/fuzz.py --quick

test-live: install emacs-ready
	$(SUITE) test-live checks -- $(PY) tests/live/smoke.py

# The Elisp suites, the live test and the tests against upstream magent again
# on Emacs 30, in a Debian trixie root built for the run (as root).
test-emacs30: install
	.ci/emacs30

# The README's two commands, verbatim, in a fresh Debian 12 root built with
# debootstrap (as root, about ten minutes; .ci/fresh-debian12 says how).
test-fresh:
	.ci/fresh-debian12

demo: install emacs-ready
	$(PY) bench/demo.py

# bench/emacs_bench.py runs bench/store_bench.py too (the backend table).
bench: install bench-migrate
	$(PY) bench/emacs_bench.py

bench-quick: install
	$(PY) bench/emacs_bench.py --quick

bench-migrate: install
	$(PY) bench/migrate_bench.py

# M-x magent-store-find-session over 10,000 generated sessions (~160 MB in a
# temp dir): from its start to its candidates, in fresh Emacs runs.
bench-find: install emacs-ready
	$(PY) bench/find_bench.py --emacs $(EMACS)

# What a conversation's start costs Emacs, through upstream magent's code
# (the pinned copy, or MAGENT_LISP): mode-on, the backend's start and its
# parts, the first save of the day, a new session's first save, a later
# save, a restart; medians of 10 fresh Emacs runs.  EMACS picks the Emacs.
bench-start: install emacs-ready
	@lisp='$(MAGENT_LISP)'; \
	if [ -z "$$lisp" ]; then \
	  if [ -z '$(UPSTREAM_TARBALL)' ]; then \
	    echo "make bench-start: upstream magent not found: no magent-*.tar.gz in $(UPSTREAM), and MAGENT_LISP is not set (see docs/DEVELOPING.md)"; exit 2; \
	  fi; \
	  tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/magent-upstream.XXXXXX") || exit 2; \
	  trap 'rm -rf "$$tmp"' EXIT; trap 'exit 130' INT TERM; \
	  tar -xzf '$(UPSTREAM_TARBALL)' -C "$$tmp" || exit 2; \
	  lisp=$$tmp/lisp; \
	fi; \
	MAGENT_LISP=$$lisp $(PY) bench/start_bench.py --emacs $(EMACS)

# 10,000 generated sessions (>= 1 GB) in a temp dir; needs ~5 GB free in $$TMPDIR.
bench-search: install
	$(PY) bench/search_bench.py

# magent's session list (upstream's real code, MAGENT_LISP) with the mode on
# vs magent's own files, at 1,000 / 3,000 / 10,000 sessions: fresh Emacs
# per run, medians of 3.  SIZES="1000,3000" narrows it; EMACS picks the Emacs.
SIZES ?= 1000,3000,10000
bench-list: install emacs-ready
	@test -n "$(MAGENT_LISP)" || { echo "make bench-list: set MAGENT_LISP to upstream magent's lisp/ folder (see docs/DEVELOPING.md)"; exit 2; }
	$(PY) bench/list_bench.py --sizes $(SIZES) --emacs $(EMACS)

# What MELPA checks, on every Elisp file: byte-compilation with warnings as
# errors, then package-lint (magent-store.el is the main file), checkdoc and
# lm-verify.  package-lint comes from Debian (elpa-package-lint).
ELISP := $(sort $(wildcard elisp/*.el))

# The warnings-as-errors compilation writes into a temporary directory: the
# compiled files `make install' built stay in place for the tests.
LINT_COMPILE := (let ((dir (getenv \"LINT_ELC\"))) (setq byte-compile-error-on-warn t \
  byte-compile-dest-file-function (lambda (f) (expand-file-name (concat (file-name-nondirectory f) \"c\") dir))))

lint: install emacs-ready
	@tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/magent-store-lint.XXXXXX") || exit 2; \
	trap 'rm -rf "$$tmp"' EXIT; trap 'exit 130' INT TERM; \
	LINT_ELC=$$tmp $(SUITE) lint steps -- sh -exc '\
	  $(PY) -m ruff check backend tests bench; \
	  $(PY) -m mypy --strict backend/magent_store; \
	  $(VENV)/bin/lint-imports --no-cache --no-logo; \
	  $(EMACS) --batch -Q -L elisp --eval "$(LINT_COMPILE)" -f batch-byte-compile $(ELISP); \
	  $(EMACS) --batch -Q -l tests/elisp/magent-store-lint.el \
	    -f magent-store-lint-batch-and-exit $(ELISP)'

clean:
	rm -rf $(VENV) build *.egg-info backend/*.egg-info .pytest_cache .mypy_cache \
	  .ruff_cache .hypothesis bench-results elisp/*.elc
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
