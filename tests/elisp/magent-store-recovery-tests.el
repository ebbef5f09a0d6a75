;;; magent-store-recovery-tests.el --- ERT: the shim when its backend dies  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A real backend, really killed.  The long runs (SIGKILLs at random
;; moments, full disks, two writers) are tests/faults/faults.py; these
;; pin what the user is told and that nothing is dropped meanwhile.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)
(require 'magent-store-status)

(defun magent-store-recovery-test--kill-and-wait (predicate)
  "SIGKILL the backend, then run timers until PREDICATE holds (5 s at most)."
  (signal-process (magent-store-backend-pid magent-store-current-backend) 'SIGKILL)
  (let ((deadline (+ (float-time) 5)))
    (while (and (not (funcall predicate)) (< (float-time) deadline))
      (sleep-for 0.05))))

(ert-deftest magent-store-giving-up-names-the-key-and-keeps-the-changes ()
  "Past the restart limit the shim stops, says how to retry, and drops nothing."
  (magent-store-test--with-backend
    (let ((magent-store-restart-limit 0)
          (magent-store-recovering nil)
          (messages nil))
      (magent-store-test--session "s-up")
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (push (apply #'format-message format args) messages))))
        (magent-store-recovery-test--kill-and-wait
         (lambda () magent-store-gave-up))
        (magent-store-append-item-content "s-up" "item-1" "kept in Emacs"))
      (should magent-store-gave-up)
      (should (equal magent-store-last-error
                     (format-message "the backend stopped, and automatic \
restarts are off (`magent-store-restart-limit' is 0)")))
      ;; The status buffer names it as the echo area did, quotes included.
      (let ((said (cl-some (lambda (m)
                             (and (string-match "\\`magent-store: \\(.*?\\); unsaved" m)
                                  (match-string 1 m)))
                           messages)))
        (should said)
        (magent-store-status)
        (with-current-buffer "*magent-store-status*"
          (should (string-search (concat "Last error:         " said)
                                 (buffer-string)))))
      (should (cl-some (lambda (m) (string-match-p "magent-store-restart retries" m))
                       messages))
      (should-not (cl-some (lambda (m) (string-match-p "\\\\\\[" m)) messages))
      (should-not (cl-some (lambda (m) (string-match-p "nothing was lost" m)) messages))
      (should (= (magent-store--unsaved (gethash "s-up" magent-store--sessions)) 1))
      (magent-store-restart)
      (should (= (magent-store-flush "s-up") 4))
      (should (equal (magent-store-test--content (magent-store-load "s-up"))
                     "kept in Emacs")))))

(ert-deftest magent-store-giving-up-says-how-often-the-backend-stopped ()
  "Within the restart limit a killed backend is restarted; past it the
shim gives up, counting every stop within the minute."
  (magent-store-test--with-backend
    (let ((magent-store-restart-limit 1)
          (magent-store-recovering nil)
          (magent-store-stops nil))
      (magent-store-open "s-twice")
      (let ((first magent-store-current-backend))
        (signal-process (magent-store-backend-pid first) 'SIGKILL)
        (with-timeout (60 (error "The backend was not restarted"))
          (while (not (and magent-store-current-backend
                           (not (eq magent-store-current-backend first))
                           (magent-store-ready-p magent-store-current-backend)))
            (sleep-for 0.05))))
      (should-not magent-store-gave-up)
      (should (= (car magent-store-stops) 1))
      (signal-process (magent-store-backend-pid magent-store-current-backend) 'SIGKILL)
      (with-timeout (60 (error "The shim never gave up"))
        (while (not magent-store-gave-up)
          (sleep-for 0.05)))
      (should magent-store-gave-up)
      (should (= (car magent-store-stops) 2))
      (should (equal magent-store-last-error
                     "the backend stopped 2 times within a minute")))))

(ert-deftest magent-store-a-restart-keeps-queueing-and-says-so-once-saved ()
  "Chunks appended while the backend restarts are saved once, in order."
  (magent-store-test--with-backend
    (let ((magent-store-recovering nil)
          (messages nil))
      (magent-store-test--session "s-again")
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (push (apply #'format-message format args) messages))))
        (signal-process (magent-store-backend-pid magent-store-current-backend) 'SIGKILL)
        ;; Appending never waits, backend or not.
        (dotimes (i 20)
          (magent-store-append-item-content "s-again" "item-1" (format "<%d>" i))
          (magent-store-request-flush "s-again")
          (sleep-for 0.01))
        (let ((deadline (+ (float-time) 5)))
          (while (and magent-store-recovering (< (float-time) deadline))
            (sleep-for 0.05))))
      (should-not magent-store-recovering)
      (should (cl-some (lambda (m) (string-match-p "restarted; everything it had not saved" m))
                       messages))
      (should (equal (magent-store-test--content (magent-store-load "s-again"))
                     (mapconcat (lambda (i) (format "<%d>" i)) (number-sequence 0 19) ""))))))

;; Measured, not timed: `make test-elisp' prints the figure.  Only the
;; waiting calls run under the short timeout: starting the backend, and
;; every call before the stop and after it, may take as long as a busy
;; machine makes them.
(ert-deftest magent-store-stop-keeps-a-backend-that-has-not-saved-everything ()
  "Stopping while entries cannot be saved (the backend hung) stops nothing
and says why; once the backend answers, stopping saves them."
  (magent-store-test--with-backend
    (let ((pid nil))
      (magent-store-test--session "s-keep")
      (setq pid (magent-store-backend-pid magent-store-current-backend))
      (let ((backend magent-store-current-backend))
        (unwind-protect
            (progn
              (magent-store-test--pause pid)
              (magent-store-append-item-content "s-keep" "item-1" "not lost")
              (let* ((magent-store-call-timeout 1)
                     (err (condition-case err
                              (list 'stopped-anyway
                                    :paused pid
                                    :current (magent-store-backend-pid
                                              magent-store-current-backend)
                                    :said (magent-store-stop)
                                    :status (process-status
                                             (magent-store-backend-process backend)))
                            (user-error err))))
                ;; Should it stop all the same, say what the backend was doing.
                (unless (eq (car err) 'user-error)
                  (ert-fail (list "Stopped though the backend was paused" err)))
                (should (string-match-p
                         "\\`1 entries are not saved yet (the backend (pid [0-9]+) did not answer.*); not stopped: C-u M-x magent-store-stop drops them\\'"
                         (cadr err))))
              (should (eq magent-store-current-backend backend))
              (should-not (magent-store-backend-stopping backend)))
          (signal-process pid 'SIGCONT))
        ;; It answers again: the stop saves what waited, then stops.
        (with-timeout (30 (error "The backend never answered again"))
          (while (magent-store-backend-unresponsive backend)
            (accept-process-output nil 0.05)))
        (magent-store-stop)
        (should-not magent-store-current-backend)
        (should (equal (magent-store-test--content (magent-store-load "s-keep"))
                       "not lost"))))))

(ert-deftest magent-store-restart-replaces-a-running-backend ()
  "Restarting a running backend stops it first, then starts a new one."
  (magent-store-test--with-backend
    (let* ((old (magent-store-ready-backend))
           (process (magent-store-backend-process old)))
      (magent-store-restart)
      (should-not (process-live-p process))
      (let ((new (magent-store-ready-backend)))
        (should-not (eq new old))
        (should (stringp (magent-store-call "status" nil)))))))

(ert-deftest magent-store-a-hung-backend-costs-one-timeout ()
  "A stopped backend blocks Emacs for one timeout, not one per waiting call.
Waiting calls then fail at once, saying what to do; streaming goes on
queueing; once the backend answers again, what queued is saved, once."
  (magent-store-test--with-backend
    (let* ((timeout 1)
           (messages nil)
           (pid nil)
           (failures nil)
           (sent 0)
           (waits 0)
           (count-sends (lambda (&rest _) (cl-incf sent)))
           blocked)
      (magent-store-open "s-hung")
      (magent-store-open "s-other")
      (magent-store-test--start-turn "s-hung")
      (magent-store-flush "s-hung")
      (setq pid (magent-store-backend-pid magent-store-current-backend))
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (push (apply #'format-message format args) messages))))
        (unwind-protect
            (progn
              (magent-store-test--pause pid)
              (magent-store-append-item-content "s-hung" "item-1" "<before>")
              (advice-add 'magent-store-send :before count-sends)
              (let ((start (float-time))
                    (magent-store-call-timeout timeout))
                ;; Five waiting calls: a save, then four of what a listing does.
                (condition-case err (magent-store-flush "s-hung")
                  (magent-store-error (push (cadr err) failures)))
                (dotimes (_ 4)
                  (condition-case err
                      (magent-store-call "list" (list magent-store-root))
                    (magent-store-error (push (cadr err) failures))))
                (setq blocked (- (float-time) start)))
              ;; Only the save was sent and waited for: the others failed at once.
              (should (= sent 1))
              ;; A header put meanwhile waits in Emacs too.
              (magent-store-put-header "s-hung" '((id . "s-hung")
                                                  (title . "put while hung")))
              ;; Streaming never waits: its flush timers run, and nothing
              ;; they do waits for the backend's output.
              (advice-add 'accept-process-output :before
                          (lambda (&rest _) (cl-incf waits))
                          '((name . magent-store-test-waits)))
              (unwind-protect
                  (progn
                    (dotimes (i 50)
                      (magent-store-append-item-content "s-hung" "item-1"
                                                        (format "<%d>" i))
                      (magent-store-request-flush "s-hung"))
                    (sleep-for 0.5))
                (advice-remove 'accept-process-output 'magent-store-test-waits))
              (should (= waits 0))
              (should (= sent 1)))
          (advice-remove 'magent-store-send count-sends)
          (signal-process pid 'SIGCONT))
        ;; It answers again: everything queued meanwhile is sent, once.
        (let ((deadline (+ (float-time) 30)))
          (while (and (magent-store-backend-unresponsive magent-store-current-backend)
                      (< (float-time) deadline))
            (sleep-for 0.05))))
      (message "hung backend: Emacs blocked %.3f s over 5 waiting calls \
\(timeout %s s)" blocked timeout)
      (should (= (length failures) 5))
      (should (string-match-p "\\`Flush of s-hung did not complete: the backend (pid [0-9]+) \
did not answer within 1s" (car (last failures))))
      (dolist (failure (butlast failures))
        (should (string-match-p "\\`list: the backend (pid [0-9]+) is not answering" failure))
        (should (string-match-p "M-x magent-store-restart restarts it" failure)))
      (should-not (magent-store-backend-unresponsive magent-store-current-backend))
      (should (cl-some (lambda (m) (string-match-p "the backend answers again" m))
                       messages))
      (should (= (magent-store-flush "s-hung") 54))
      (should (equal (magent-store-test--content (magent-store-load "s-hung"))
                     (concat "<before>"
                             (mapconcat (lambda (i) (format "<%d>" i))
                                        (number-sequence 0 49) ""))))
      (should (equal (alist-get 'title (plist-get (magent-store-load "s-hung")
                                                  :header))
                     "put while hung"))
      (should (equal (magent-store-open "s-other") 0)))))

(ert-deftest magent-store-a-flush-refused-as-not-open-reopens-the-session-and-saves ()
  "A backend that no longer has the session open refuses its batch: the
session is opened again there and everything is saved, once."
  (magent-store-test--with-backend
    (let ((magent-store-retry-interval 0.05)
          (messages nil))
      (magent-store-open "s-gone")
      (magent-store-test--start-turn "s-gone")
      (magent-store-append-item-content "s-gone" "item-1" "before ")
      (magent-store-flush "s-gone")
      ;; Closed in the backend, behind the shim's back.
      (magent-store-call "close" (list "s-gone"))
      (let ((session (gethash "s-gone" magent-store--sessions)))
        (cl-letf (((symbol-function 'message)
                   (lambda (format &rest args)
                     (push (apply #'format-message format args) messages))))
          (magent-store-append-item-content "s-gone" "item-1" "after the close")
          (magent-store-request-flush "s-gone")
          ;; Timers run: the flush, its refusal's retry, the reopening.
          (let ((deadline (+ (float-time) 30)))
            (while (and (or (not (magent-store--session-opened session))
                            (magent-store--session-inflight session)
                            (> (magent-store--unsaved session) 0))
                        (< (float-time) deadline))
              (sleep-for 0.05))))
        (should (cl-some (lambda (m) (string-match-p "is not open here" m)) messages))
        (should (magent-store--session-opened session))
        (should (= (magent-store--unsaved session) 0)))
      (should (equal (magent-store-test--content (magent-store-load "s-gone"))
                     "before after the close")))))

(provide 'magent-store-recovery-tests)
;;; magent-store-recovery-tests.el ends here
