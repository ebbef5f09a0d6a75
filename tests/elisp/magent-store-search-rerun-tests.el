;;; magent-store-search-rerun-tests.el --- A new search stops the one still running  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; g in a results buffer while its search still runs: the running search
;; process is stopped, and only the new one's results are drawn (an Elisp
;; mutation survivor: dropping the stop passed every test).  Real backend,
;; real `magent-store search' processes.

;;; Code:

(require 'ert)
(require 'magent-store-search-tests)

(defun magent-store-search-rerun-test--failures (function)
  "Call FUNCTION; return the messages it showed that say a search failed."
  (let* ((said nil)
         (record (lambda (format &rest args)
                   (when format
                     (let ((text (apply #'format-message format args)))
                       (when (string-match-p "fail" text) (push text said)))))))
    (advice-add 'message :before record)
    (unwind-protect (funcall function)
      (advice-remove 'message record))
    said))

(ert-deftest magent-store-search-a-new-search-stops-the-one-running ()
  "Searching again while a search runs stops it; the new one is drawn."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-one" '("a shared needle"))
    (let* ((buffer (magent-store-search "shared needle"))
           (first (buffer-local-value 'magent-store-search--process buffer)))
      ;; A search is a process of its own: still starting, here.
      (should (process-live-p first))
      (should-not (magent-store-search-rerun-test--failures
                   (lambda () (with-current-buffer buffer
                                (call-interactively (key-binding "g"))))))
      (let ((second (buffer-local-value 'magent-store-search--process buffer)))
        (should (processp second))
        (should-not (eq first second))
        (should-not (process-live-p first))
        (magent-store-search-test--wait buffer)
        (should (equal (magent-store-search-test--ids buffer) '("s-one")))))))

(ert-deftest magent-store-search-searching-again-as-a-command-stops-the-one-running ()
  "`magent-store-search' again while its search runs stops that search,
without saying it failed; the new query's results are drawn."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-one" '("a shared needle"))
    (magent-store-search-test--write "s-two" '("another haystack"))
    (let* ((buffer (magent-store-search "shared needle"))
           (first (buffer-local-value 'magent-store-search--process buffer)))
      (should (process-live-p first))
      (should-not (magent-store-search-rerun-test--failures
                   (lambda () (should (eq (magent-store-search "haystack") buffer)))))
      (should-not (process-live-p first))
      (should-not (eq first (buffer-local-value 'magent-store-search--process buffer)))
      (magent-store-search-test--wait buffer)
      (should (equal (magent-store-search-test--ids buffer) '("s-two"))))))

(provide 'magent-store-search-rerun-tests)
;;; magent-store-search-rerun-tests.el ends here
