# magent-store: every target works on a fresh machine; the ones that need the
# virtualenv build it first.  `make demo` and `make test` are the README's two
# commands.

PYTHON  ?= python3
EMACS   ?= emacs
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: install test test-python test-elisp test-live demo bench bench-quick bench-migrate lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: test-python test-elisp test-live

test-python: install
	$(PY) -m pytest -q

test-elisp: install
	$(EMACS) --batch -Q -L elisp -L tests/elisp \
	  --eval '(setq magent-store-test-python "$(abspath $(VENV))/bin/magent-store")' \
	  -l tests/elisp/magent-store-tests.el -l tests/elisp/magent-store-timing-tests.el \
	  -f ert-run-tests-batch-and-exit

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

lint: install
	$(PY) -m ruff check backend tests bench
	$(PY) -m mypy --strict backend/magent_store
	$(EMACS) --batch -Q -L elisp --eval '(setq byte-compile-error-on-warn t)' \
	  -f batch-byte-compile elisp/magent-store.el elisp/magent-store-magent.el elisp/magent-store-timing.el
	$(EMACS) --batch -Q --eval '(checkdoc-file "elisp/magent-store.el")'
	$(EMACS) --batch -Q --eval '(checkdoc-file "elisp/magent-store-timing.el")'
	$(EMACS) --batch -Q --eval '(checkdoc-file "elisp/magent-store-magent.el")'
	rm -f elisp/*.elc

clean:
	rm -rf $(VENV) build *.egg-info backend/*.egg-info .pytest_cache .mypy_cache \
	  .ruff_cache .hypothesis bench-results elisp/*.elc
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
