;;; magent-store-ert-runner.el --- ERT in batch, with a time limit per test  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; emacs --batch -Q -l tests/elisp/magent-store-ert-runner.el ... \
;;   -f magent-store-ert-run-batch-and-exit
;;
;; `ert-run-tests-batch-and-exit', but a test that runs longer than
;; `magent-store-ert-test-limit' seconds (MAGENT_STORE_ERT_LIMIT, default
;; 60) fails with its name and the limit, and the run goes on with the
;; next test.  A test that hangs waiting (for a reply that never comes, a
;; process, a timer) cannot hang the run: the limit is a timer, which runs
;; whenever the test waits.  A test that loops without ever waiting runs
;; no timer: for that, each test's name is written, as it starts, to the
;; file MAGENT_STORE_ERT_CURRENT names (when set), and whatever runs Emacs
;; (tests/summary.py) stops it once one test has run well past the limit,
;; and names the test.
;;
;; Two settings serve `make mutation-elisp', which runs, for each planted
;; bug, only the tests that reach the changed function: when
;; MAGENT_STORE_ERT_SELECT names a file, only the tests named in it (one
;; name a line) run; when MAGENT_STORE_ERT_FAIL_FAST is set (not empty),
;; the run stops with status 1 at the first test that does not pass as
;; expected.  Unset, the run is `make test''s: every test, to the end.

;;; Code:

(require 'ert)

(defvar magent-store-ert-test-limit
  (let ((limit (getenv "MAGENT_STORE_ERT_LIMIT")))
    (if (and limit (string-match-p "\\`[0-9]+\\(?:\\.[0-9]+\\)?\\'" limit))
        (string-to-number limit)
      60))
  "Seconds a test may run before it fails as hung.")

(defvar magent-store-ert-current-file (getenv "MAGENT_STORE_ERT_CURRENT")
  "File that names the test running now, for a watchdog outside Emacs; or nil.")

(defvar magent-store-ert-select-file (getenv "MAGENT_STORE_ERT_SELECT")
  "File naming the tests to run, one a line; or nil for every test.")

(defvar magent-store-ert-fail-fast
  (not (member (getenv "MAGENT_STORE_ERT_FAIL_FAST") '(nil "")))
  "Non-nil: stop the run at the first test that does not pass as expected.")

(defun magent-store-ert--selected ()
  "Return the selector of the tests `magent-store-ert-select-file' names."
  (with-temp-buffer
    (insert-file-contents magent-store-ert-select-file)
    `(member ,@(delq nil (mapcar (lambda (name)
                                   (let ((test (intern name)))
                                     (and (ert-test-boundp test) test)))
                                 (split-string (buffer-string) "\n" t "[ \t]+"))))))

(defun magent-store-ert--stop-at-failure (_stats test _listener)
  "Exit Emacs with status 1 when TEST's result was not expected."
  (let ((result (ert-test-most-recent-result test)))
    (unless (ert-test-result-expected-p test result)
      (message "Stopped at the first unexpected result: %s" (ert-test-name test))
      (kill-emacs 1))))

(defun magent-store-ert--limited (name body)
  "Return BODY, the body of test NAME, failing when it exceeds the limit."
  (lambda ()
    (let ((limit magent-store-ert-test-limit))
      (when magent-store-ert-current-file
        (let ((coding-system-for-write 'utf-8-unix))
          (write-region (format "%s %s\n" limit name) nil
                        magent-store-ert-current-file nil 'silent)))
      (with-timeout (limit (ert-fail (format "%s took longer than %s s: stopped as hung"
                                             name limit)))
        (funcall body)))))

(defun magent-store-ert-limit-tests ()
  "Give every test defined so far the time limit, once."
  (dolist (test (ert-select-tests t t))
    (unless (get (ert-test-name test) 'magent-store-ert-limited)
      (put (ert-test-name test) 'magent-store-ert-limited t)
      (setf (ert-test-body test)
            (magent-store-ert--limited (ert-test-name test) (ert-test-body test))))))

(defun magent-store-ert-run-batch-and-exit (&optional selector)
  "Run the tests SELECTOR selects, each under the limit, then exit.
As `ert-run-tests-batch-and-exit'."
  (magent-store-ert-limit-tests)
  (when magent-store-ert-fail-fast
    (advice-add 'ert-run-or-rerun-test :after #'magent-store-ert--stop-at-failure))
  (ert-run-tests-batch-and-exit
   (if magent-store-ert-select-file (magent-store-ert--selected) selector)))

(provide 'magent-store-ert-runner)
;;; magent-store-ert-runner.el ends here
