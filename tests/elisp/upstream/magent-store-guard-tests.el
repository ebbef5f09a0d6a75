;;; magent-store-guard-tests.el --- No error of any kind reaches magent's call  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; magent-store-mode's advice runs inside magent's own calls: whatever
;; goes wrong in it is recorded (`magent-store-status' lists it) and magent
;; goes on.  Not only the shim's own errors: a plain `error' from the
;; adapter (a scope it does not know) must stay out of magent's call too.
;; Upstream magent's code, a real backend, as in magent-store-magent-tests.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-magent-tests)

(ert-deftest magent-store-magent-any-error-is-kept-out-of-magent ()
  "A session under a scope the adapter cannot place: magent's calls all return."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (pcase-let* ((session (magent-store-magent-test--session "s-scope-42" 42))
                 (`(,thread ,turn-id ,item)
                  (magent-store-magent-test--reply session)))
      (magent-thread-append-item-content thread item "a chunk")
      (magent-session-save-deferred-for-session session 42)
      (magent-thread-complete-item thread item)
      (magent-thread-complete-turn thread turn-id nil)
      (magent-session-save-for-session session 42)
      ;; Each failure is recorded with its message, and the session is
      ;; not in the store.
      (should magent-store-magent--adapter-failures)
      (dolist (row magent-store-magent--adapter-failures)
        (should (equal (nth 2 row) "Unknown magent scope 42")))
      (should (member "opening a session"
                      (mapcar #'caar magent-store-magent--adapter-failures)))
      (should-not (gethash "s-scope-42" magent-store--sessions)))))

;; The same failure again is counted, not said again: the status gives
;; how many times each kind failed.
(ert-deftest magent-store-magent-a-repeated-failure-is-counted-and-said-once ()
  "Every event of a session the adapter cannot place fails to open it: the
status counts each one, the user is told once."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (pcase-let* ((messages-before (with-current-buffer (messages-buffer)
                                    (buffer-string)))
                 (session (magent-store-magent-test--session "s-scope-43" 43))
                 (`(,thread ,turn-id ,item)
                  (magent-store-magent-test--reply session)))
      (magent-thread-append-item-content thread item "a chunk")
      (magent-thread-complete-item thread item)
      (let ((events (length (magent-thread-journal thread)))
            (said (with-current-buffer (messages-buffer)
                    (substring (buffer-string) (length messages-before)))))
        (should (> events 1))
        (should (equal (cadr (assoc '("opening a session" . error)
                                    magent-store-magent--adapter-failures))
                       events))
        (should (equal (cadr (assoc '("forwarding a chunk" . error)
                                    magent-store-magent--adapter-failures))
                       1))
        (should (= (cl-count-if (lambda (line)
                                  (string-match-p "opening a session failed" line))
                                (split-string said "\n"))
                   1))
        (let ((status (magent-store-magent--adapter-status)))
          (should (string-match-p
                   (format "^Adapter: +opening a session, %d times: Unknown magent scope 43$"
                           events)
                   status))
          (should (string-match-p
                   "^Adapter: +forwarding a chunk, 1 time: Unknown magent scope 43$"
                   status)))))))

(provide 'magent-store-guard-tests)
;;; magent-store-guard-tests.el ends here
