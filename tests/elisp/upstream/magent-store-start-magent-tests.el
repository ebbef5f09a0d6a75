;;; magent-store-start-magent-tests.el --- A conversation starts without a freeze  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The first save of a new session, through upstream magent's own
;; `magent-session-save-for-session', with a real backend: it waits only
;; for its own flush, never for a reply the backend holds back.  The
;; backend is started with its held replies kept for an hour (its test
;; hook MAGENT_STORE_TEST_ACK_DELAY): a save that waited on one would
;; time out instead of returning, whatever the speed of the machine.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-magent-tests)

(defun magent-store-start-test--turn (session text)
  "Play one completed turn of SESSION (global) answering TEXT, as magent does."
  (let* ((thread (magent-session-thread-ledger session))
         (turn-id (magent-thread-turn-id
                   (magent-thread-create-turn thread "hello" nil
                                              (list :source 'agent-run-turn))))
         (item (magent-thread-start-item thread turn-id 'message
                                         :role 'assistant)))
    (magent-thread-record-user-message-if-needed
     thread turn-id "hello" nil (list :source 'agent-run-turn))
    (magent-session-save-deferred-for-session session 'global)
    (magent-thread-append-item-content thread item text)
    (magent-session-save-deferred-for-session session 'global)
    (magent-thread-complete-item thread item :content text)
    (magent-thread-complete-turn thread turn-id nil)))

(defun magent-store-start-test--log-lines (id)
  "Return the lines of session ID's log (global scope) as they are on disk."
  (with-temp-buffer
    (insert-file-contents
     (expand-file-name (concat id ".jsonl")
                       (magent-store-magent--scope-directory 'global)))
    (split-string (buffer-string) "\n" t)))

(ert-deftest magent-store-magent-a-new-sessions-first-save-waits-for-no-held-reply ()
  "A new session's first save returns durable with tick replies held for an hour."
  (magent-store-magent-test--use-magent 6)
  (let ((process-environment (cons "MAGENT_STORE_TEST_ACK_DELAY=3600"
                                   process-environment))
        ;; Waiting on a held reply would end here, with an error.
        (magent-store-call-timeout 3))
    (magent-store-magent-test--with-store
      (magent-store-start)
      (dolist (id '("s-first-1" "s-first-2"))
        (let ((session (magent-store-magent-test--session id 'global)))
          (magent-store-start-test--turn session (concat "the answer of " id))
          (magent-session-save-for-session session 'global)
          (should-not magent-store-magent--adapter-failures)
          (let ((store (gethash id magent-store--sessions)))
            (should-not (magent-store--session-inflight store))
            (should (= 0 (magent-store--session-fill store)))
            ;; What the save returned for is in the log on disk: killed
            ;; now, the backend could lose none of it.
            (let ((lines (magent-store-start-test--log-lines id)))
              (should (= (length lines)
                         (magent-store--session-durable-seq store)))
              (should (string-match-p (regexp-quote (concat "the answer of " id))
                                      (mapconcat #'identity lines "\n")))))
          ;; A later save of the same session, the same.
          (magent-store-start-test--turn session "a second answer")
          (magent-session-save-for-session session 'global)
          (should-not magent-store-magent--adapter-failures)
          (should-not (magent-store--session-inflight
                       (gethash id magent-store--sessions))))))))

(provide 'magent-store-start-magent-tests)
;;; magent-store-start-magent-tests.el ends here
