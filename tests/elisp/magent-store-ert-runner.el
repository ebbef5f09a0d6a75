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
;; whenever the test waits.

;;; Code:

(require 'ert)

(defvar magent-store-ert-test-limit
  (let ((limit (getenv "MAGENT_STORE_ERT_LIMIT")))
    (if (and limit (string-match-p "\\`[0-9]+\\(?:\\.[0-9]+\\)?\\'" limit))
        (string-to-number limit)
      60))
  "Seconds a test may run before it fails as hung.")

(defun magent-store-ert--limited (name body)
  "Return BODY, the body of test NAME, failing when it exceeds the limit."
  (lambda ()
    (let ((limit magent-store-ert-test-limit))
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
