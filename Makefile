# magent-store: every target works on a fresh machine; the ones that need the
# virtualenv build it first.  `make demo` and `make test` are the README's two
# commands.

PYTHON  ?= python3
EMACS   ?= emacs
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: install test test-python test-elisp test-live test-magent test-magent-if-available demo bench bench-quick bench-migrate bench-search lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: lint test-python test-elisp test-live test-magent-if-available

test-python: install
	$(PY) -m pytest -q

# Every tests/elisp/*-tests.el runs here; tests against upstream magent's own
# code live in tests/elisp/upstream/ and run with `make test-magent'.  They are
# loaded by `require' (each provides its file name): a test file may require
# another, and Emacs 30's ERT refuses a test file loaded twice.
ELISP_TESTS := $(sort $(wildcard tests/elisp/*-tests.el))
UPSTREAM_TESTS := $(sort $(wildcard tests/elisp/upstream/*-tests.el))

test-elisp: install
	$(EMACS) --batch -Q -L elisp -L tests/elisp \
	  --eval '(setq magent-store-test-python "$(abspath $(VENV))/bin/magent-store")' \
	  $(foreach t,$(ELISP_TESTS),--eval "(require '$(basename $(notdir $(t))))") \
	  -f ert-run-tests-batch-and-exit

# MAGENT_LISP names upstream magent's lisp/ folder (see the README).
test-magent: install
	@test -n "$(MAGENT_LISP)" || { echo "make test-magent: set MAGENT_LISP to upstream magent's lisp/ folder (see the README)"; exit 2; }
	$(EMACS) --batch -Q -L elisp -L tests/elisp -L tests/elisp/upstream \
	  --eval '(setq magent-store-test-python "$(abspath $(VENV))/bin/magent-store")' \
	  $(foreach t,$(UPSTREAM_TESTS),--eval "(require '$(basename $(notdir $(t))))") \
	  -f ert-run-tests-batch-and-exit

test-magent-if-available:
	@if [ -n "$(MAGENT_LISP)" ]; then $(MAKE) --no-print-directory test-magent; \
	else echo "*** SKIPPED: the tests against upstream magent (MAGENT_LISP is not set; see the README) ***"; fi

test-live: install
	$(PY) tests/live/smoke.py

demo: install
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

# What MELPA checks, on every Elisp file: byte-compilation with warnings as
# errors, then package-lint (magent-store.el is the main file), checkdoc and
# lm-verify.  package-lint comes from Debian (elpa-package-lint).
ELISP := $(sort $(wildcard elisp/*.el))

lint: install
	$(PY) -m ruff check backend tests bench
	$(PY) -m mypy --strict backend/magent_store
	$(EMACS) --batch -Q -L elisp --eval '(setq byte-compile-error-on-warn t)' \
	  -f batch-byte-compile $(ELISP)
	rm -f elisp/*.elc
	$(EMACS) --batch -Q -l tests/elisp/magent-store-lint.el \
	  -f magent-store-lint-batch-and-exit $(ELISP)

clean:
	rm -rf $(VENV) build *.egg-info backend/*.egg-info .pytest_cache .mypy_cache \
	  .ruff_cache .hypothesis bench-results elisp/*.elc
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
