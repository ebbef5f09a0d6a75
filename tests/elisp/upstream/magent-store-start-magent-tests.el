;;; magent-store-start-magent-tests.el --- A conversation starts without a freeze  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The first save of a new session, through upstream magent's own
;; `magent-session-save-for-session', with a real backend: it waits only
;; for its own flush, never for a reply the backend delays.  The
;; backend is started with its delayed replies kept for an hour (its test
;; hook MAGENT_STORE_TEST_ACK_DELAY): a save that waited on one would
;; time out instead of returning, whatever the speed of the machine.
;;
;; The backend starts at the first idle moment after the mode turns on:
;; the tests fire that idle timer themselves (batch Emacs is never idle)
;; and count the waits its function made (none: the port, the handshake
;; and the version check come through process filters).

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

(ert-deftest magent-store-magent-a-new-sessions-first-save-waits-for-no-delayed-reply ()
  "A new session's first save returns durable with tick replies held for an hour."
  (magent-store-magent-test--use-magent 6)
  (let ((process-environment (cons "MAGENT_STORE_TEST_ACK_DELAY=3600"
                                   process-environment))
        ;; Waiting on a delayed reply would end here, with an error.
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

(defun magent-store-start-test--waits (function)
  "Call FUNCTION; return how many times it waited for a process."
  (let ((waits 0))
    (cl-letf* ((accept (symbol-function 'accept-process-output))
               ((symbol-function 'accept-process-output)
                (lambda (&rest args) (cl-incf waits) (apply accept args))))
      (funcall function))
    waits))

(defun magent-store-start-test--fire-start-timer ()
  "Run the idle timer the mode set to start the backend; return its waits."
  (let ((timer magent-store-magent--start-timer))
    (should (memq timer timer-idle-list))
    (magent-store-start-test--waits (lambda () (timer-event-handler timer)))))

(defun magent-store-start-test--durable-save (id)
  "Play a turn of a new session ID and save it; check it is on disk."
  (let ((session (magent-store-magent-test--session id 'global)))
    (magent-store-start-test--turn session (concat "the answer of " id))
    (magent-session-save-for-session session 'global)
    (should-not magent-store-magent--adapter-failures)
    (let ((store (gethash id magent-store--sessions))
          (lines (magent-store-start-test--log-lines id)))
      (should-not (magent-store--session-inflight store))
      (should (= (length lines) (magent-store--session-durable-seq store)))
      (should (string-match-p (regexp-quote (concat "the answer of " id))
                              (mapconcat #'identity lines "\n"))))))

(ert-deftest magent-store-magent-the-backend-starts-when-emacs-is-first-idle ()
  "Mode on: one idle timer starts the backend, waiting for nothing; filters finish it."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (should-not magent-store-current-backend)
    ;; Turned on again: still one timer.
    (let ((timer magent-store-magent--start-timer))
      (magent-store-mode 1)
      (should (eq timer magent-store-magent--start-timer))
      (should (= 1 (cl-count #'magent-store-magent--start-backend timer-idle-list
                             :key #'timer--function))))
    (should (= 0 (magent-store-start-test--fire-start-timer)))
    (should-not magent-store-magent--start-timer)
    (let ((backend magent-store-current-backend))
      (should backend)
      ;; Started, not waited for: nothing was read from it yet.
      (should-not (magent-store-backend-ready backend))
      ;; Emacs waiting as it does when idle, running filters and timers.
      (let ((deadline (+ (float-time) 30)))
        (while (and (not (magent-store-ready-p backend))
                    (< (float-time) deadline))
          (accept-process-output nil 0.05)))
      (should (magent-store-ready-p backend))
      (should-not magent-store-last-error)
      (magent-store-start-test--durable-save "s-after-ready")
      (should (eq backend magent-store-current-backend)))))

(ert-deftest magent-store-magent-a-save-before-the-backend-is-ready-is-durable ()
  "The first save of the day, with the backend still starting, returns durable."
  (magent-store-magent-test--use-magent 6)
  (let ((process-environment (cons "MAGENT_STORE_TEST_ACK_DELAY=3600"
                                   process-environment))
        (magent-store-call-timeout 10))
    (magent-store-magent-test--with-store
      (magent-store-start-test--fire-start-timer)
      (should-not (magent-store-backend-ready magent-store-current-backend))
      (magent-store-start-test--durable-save "s-before-ready"))))

(ert-deftest magent-store-magent-a-backend-that-cannot-start-is-said-once ()
  "Mode on with no backend installed: said once, nothing raised into magent.
magent's save records its failure for the status buffer all the same."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let ((magent-store-python (list (expand-file-name "no-such-backend" tmp)))
          (said nil))
      (cl-letf* ((show (symbol-function 'message))
                 ((symbol-function 'message)
                  (lambda (format &rest args)
                    (when format (push (apply #'format-message format args) said))
                    (apply show format args))))
        (magent-store-start-test--fire-start-timer)
        ;; Turned off and on again: tried again, not said again.
        (magent-store-mode -1)
        (magent-store-mode 1)
        (magent-store-start-test--fire-start-timer)
        ;; magent's turn and its save go on, and say nothing more.
        (let ((session (magent-store-magent-test--session "s-no-backend" 'global)))
          (magent-store-start-test--turn session "unsaved")
          (magent-session-save-for-session session 'global)))
      (should (= 1 (cl-count-if (lambda (text) (string-match-p "no-such-backend" text))
                                said)))
      (should (string-match-p "not installed" magent-store-last-error))
      (should (assoc '("a save" . user-error) magent-store-magent--adapter-failures))
      (should-not magent-store-current-backend))))

(provide 'magent-store-start-magent-tests)
;;; magent-store-start-magent-tests.el ends here
