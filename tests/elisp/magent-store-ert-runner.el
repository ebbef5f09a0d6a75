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
  (ert-run-tests-batch-and-exit selector))

(provide 'magent-store-ert-runner)
;;; magent-store-ert-runner.el ends here
