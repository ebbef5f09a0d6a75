# magent-store: every target works on a fresh machine; the ones that need the
# virtualenv build it first.  `make demo` and `make test` are the README's two
# commands.

PYTHON  ?= python3
EMACS   ?= emacs
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: install emacs-ready mutation test test-python test-elisp test-live test-magent test-magent-if-available test-emacs30 test-faults test-faults-quick demo bench bench-quick bench-migrate bench-search bench-list lint clean

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

test: lint test-python test-elisp test-live test-magent-if-available test-faults-quick

# The plot extra too, so the plot test runs.
PLOT_STAMP := $(VENV)/.plot-installed
$(PLOT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,plot]'
	touch $@

test-python: install $(PLOT_STAMP)
	$(PY) -m pytest -q

# Mutation testing (mutmut) of ledger.py, store.py, server.py and search.py,
# each against its own test file; scores and survivors under build/mutation/
# (README, "Testing").  MODULES="ledger" narrows it, JOBS=2 runs two mutants
# at once.
MUTMUT_STAMP := $(VENV)/.mutmut-installed
$(MUTMUT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet 'mutmut>=3.8,<4'
	touch $@

mutation: install $(MUTMUT_STAMP)
	sh tests/mutation/run.sh

# Every tests/elisp/*-tests.el runs here; tests against upstream magent's own
# code live in tests/elisp/upstream/ and run with `make test-magent'.  They are
# loaded by `require' (each provides its file name): a test file may require
# another, and Emacs 30's ERT refuses a test file loaded twice.
ELISP_TESTS := $(sort $(wildcard tests/elisp/*-tests.el))
UPSTREAM_TESTS := $(sort $(wildcard tests/elisp/upstream/*-tests.el))

test-elisp: install emacs-ready
	$(EMACS) --batch -Q -L elisp -L tests/elisp \
	  --eval '(setq magent-store-test-python "$(abspath $(VENV))/bin/magent-store")' \
	  $(foreach t,$(ELISP_TESTS),--eval "(require '$(basename $(notdir $(t))))") \
	  -f ert-run-tests-batch-and-exit

# MAGENT_LISP names upstream magent's lisp/ folder (see the README).
test-magent: install emacs-ready
	@test -n "$(MAGENT_LISP)" || { echo "make test-magent: set MAGENT_LISP to upstream magent's lisp/ folder (see the README)"; exit 2; }
	$(EMACS) --batch -Q -L elisp -L tests/elisp -L tests/elisp/upstream \
	  --eval '(setq magent-store-test-python "$(abspath $(VENV))/bin/magent-store")' \
	  $(foreach t,$(UPSTREAM_TESTS),--eval "(require '$(basename $(notdir $(t))))") \
	  -f ert-run-tests-batch-and-exit

test-magent-if-available:
	@if [ -n "$(MAGENT_LISP)" ]; then $(MAKE) --no-print-directory test-magent; \
	else echo "*** SKIPPED: the tests against upstream magent (MAGENT_LISP is not set; see the README) ***"; fi

# A real Emacs streams through the shim while its backend is SIGKILLed, its
# disk fills, a second Emacs writes the same session; strangers fuzz the port.
test-faults: install emacs-ready
	$(PY) tests/faults/faults.py
	$(PY) tests/faults/fuzz.py

test-faults-quick: install emacs-ready
	$(PY) tests/faults/faults.py --quick
	$(PY) tests/faults/fuzz.py --quick

test-live: install emacs-ready
	$(PY) tests/live/smoke.py

# The Elisp suites, the live test and the upstream tests (MAGENT_LISP) again
# on Emacs 30, in a Debian trixie root built for the run (as root).
test-emacs30: install
	.ci/emacs30

demo: install emacs-ready
	$(PY) bench/demo.py

# bench/emacs_bench.py runs bench/store_bench.py too (the backend table).
bench: install bench-migrate
	$(PY) bench/emacs_bench.py

bench-quick: install
	$(PY) bench/emacs_bench.py --quick

bench-migrate: install
	$(PY) bench/migrate_bench.py

# 10,000 generated sessions (>= 1 GB) in a temp dir; needs ~5 GB free in $$TMPDIR.
bench-search: install
	$(PY) bench/search_bench.py

# magent's session list (upstream's real code, MAGENT_LISP) with the mode on
# vs magent's own files, at 1,000 / 3,000 / 10,000 sessions: fresh Emacs
# per run, medians of 3.  SIZES="1000,3000" narrows it; EMACS picks the Emacs.
SIZES ?= 1000,3000,10000
bench-list: install emacs-ready
	@test -n "$(MAGENT_LISP)" || { echo "make bench-list: set MAGENT_LISP to upstream magent's lisp/ folder (see the README)"; exit 2; }
	$(PY) bench/list_bench.py --sizes $(SIZES) --emacs $(EMACS)

# What MELPA checks, on every Elisp file: byte-compilation with warnings as
# errors, then package-lint (magent-store.el is the main file), checkdoc and
# lm-verify.  package-lint comes from Debian (elpa-package-lint).
ELISP := $(sort $(wildcard elisp/*.el))

lint: install emacs-ready
	$(PY) -m ruff check backend tests bench
	$(PY) -m mypy --strict backend/magent_store
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(EMACS) --batch -Q -L elisp --eval '(setq byte-compile-error-on-warn t)' \
	  -f batch-byte-compile $(ELISP)
	rm -f elisp/*.elc
	$(EMACS) --batch -Q -l tests/elisp/magent-store-lint.el \
	  -f magent-store-lint-batch-and-exit $(ELISP)

clean:
	rm -rf $(VENV) build *.egg-info backend/*.egg-info .pytest_cache .mypy_cache \
	  .ruff_cache .hypothesis bench-results elisp/*.elc
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
