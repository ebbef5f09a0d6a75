;;; magent-store-recovery-edges-tests.el --- ERT: the edges of the shim's recovery  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A real backend, really stopped (SIGSTOP), killed (SIGKILL) or made to
;; refuse batches: its file size limit (`ulimit -f') makes it refuse a
;; batch that would grow the session's log past it, as a full disk
;; does.  What is pinned here is what the recovery does at its edges:
;; which sessions it sends to, when it says it is done, what a refusal
;; tells the user, and what it leaves pending.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)

(defun magent-store-recovery-edges-test--wait (predicate seconds)
  "Run timers and read replies until PREDICATE holds, SECONDS at most."
  (let ((deadline (+ (float-time) seconds)))
    (while (and (not (funcall predicate)) (< (float-time) deadline))
      (sleep-for 0.05))
    (funcall predicate)))

(defun magent-store-recovery-edges-test--hang (pid)
  "Stop the backend of PID and have the shim take it as not answering."
  (magent-store-test--pause pid)
  (let ((magent-store-call-timeout 1))
    (should-error (magent-store-call "status" nil) :type 'magent-store-error))
  (should (magent-store-backend-unresponsive magent-store-current-backend)))

(defun magent-store-recovery-edges-test--small-disk-python ()
  "Return the backend command run with a file size limit of 64 blocks.
Past it the backend cannot grow a session's log: it refuses the batch."
  (list (executable-find "sh") "-c" "ulimit -f 64; exec \"$0\" \"$@\""
        magent-store-python))

(defun magent-store-recovery-edges-test--open-sessions ()
  "Return the ids of the sessions the backend has open."
  (append (gethash "open-sessions"
                   (json-parse-string (magent-store-call "status" nil)))
          nil))

(defun magent-store-recovery-edges-test--on-disk (session-id)
  "Return the first item's content of SESSION-ID in the files on disk.
Read by the command-line tool: nothing is flushed or sent to read it."
  (magent-store-test--content (list :snapshot (magent-store-test--show session-id))))

(ert-deftest magent-store-a-backend-that-stops-leaves-no-flush-timer-pending ()
  "When the backend dies, a session's scheduled flush is cancelled: the
new backend gets the queue when the session is reopened, and no timer
of the old backend is left to fire later."
  (magent-store-test--with-backend
    (let ((magent-store-flush-interval 3600.0)
          (magent-store-recovering nil))
      (let* ((session (magent-store-test--session "s-timer"))
             (killed magent-store-current-backend)
             timer)
        (magent-store-append-item-content "s-timer" "item-1" "queued")
        (magent-store-request-flush "s-timer")
        (setq timer (magent-store--session-timer session))
        (should (memq timer timer-list))
        (signal-process (magent-store-backend-pid killed) 'SIGKILL)
        (should (magent-store-recovery-edges-test--wait
                 (lambda () (and (not (eq magent-store-current-backend killed))
                                 (magent-store--session-opened session)
                                 (= (magent-store--unsaved session) 0)))
                 30))
        (should-not (memq timer timer-list))
        (should (equal (magent-store-recovery-edges-test--on-disk "s-timer")
                       "queued"))))))

(ert-deftest magent-store-a-backend-answering-again-gets-the-queue-of-idle-sessions-only ()
  "When a backend taken to be hung answers again, a session that queued
entries meanwhile (and has nothing in flight) sends them at once; a
session with nothing queued sends nothing."
  (magent-store-test--with-backend
    (magent-store-open "s-busy")
    (magent-store-open "s-idle")
    (magent-store-test--start-turn "s-busy")
    (magent-store-flush "s-busy")
    (magent-store-flush "s-idle")
    (let* ((busy (gethash "s-busy" magent-store--sessions))
           (idle (gethash "s-idle" magent-store--sessions))
           (idle-flushes (magent-store--session-flushes idle))
           (pid (magent-store-backend-pid magent-store-current-backend)))
      (unwind-protect
          (progn
            (magent-store-recovery-edges-test--hang pid)
            (magent-store-append-item-content "s-busy" "item-1" "while hung")
            (magent-store-request-flush "s-busy")
            ;; Its flush came and could not send: nothing more will.
            (should (magent-store-recovery-edges-test--wait
                     (lambda () (null (magent-store--session-timer busy))) 30))
            (should-not (magent-store--session-inflight busy))
            (should (> (magent-store--session-fill busy) 0)))
        (signal-process pid 'SIGCONT))
      (should (magent-store-recovery-edges-test--wait
               (lambda () (not (magent-store-backend-unresponsive
                                magent-store-current-backend)))
               30))
      ;; Sent when the answer came (its reply may have come too), nothing
      ;; for the idle one.
      (should (= (magent-store--session-fill busy) 0))
      (should-not (magent-store--session-inflight idle))
      (should (= (magent-store--session-flushes idle) idle-flushes))
      (should (magent-store-recovery-edges-test--wait
               (lambda () (= (magent-store--unsaved busy) 0)) 30))
      (should (equal (magent-store-recovery-edges-test--on-disk "s-busy")
                     "while hung")))))

(ert-deftest magent-store-what-queued-behind-a-batch-in-flight-is-saved-once-the-backend-answers ()
  "A batch in flight when the backend hangs, then chunks whose flush came
while it did not answer: once it answers, they are saved, without
another chunk or flush to send them."
  (magent-store-test--with-backend
    (let ((session (magent-store-test--session "s-behind"))
          (pid (magent-store-backend-pid magent-store-current-backend)))
      (unwind-protect
          (progn
            (magent-store-test--pause pid)
            (magent-store-append-item-content "s-behind" "item-1" "<in flight>")
            (magent-store--tick session)
            (should (= (length (magent-store--session-inflight session)) 1))
            (magent-store-recovery-edges-test--hang pid)
            ;; A stream goes on: its flush comes due with a later chunk.
            (magent-store-append-item-content "s-behind" "item-1" "<a>")
            (magent-store-append-item-content
             "s-behind" "item-1" "<b>" nil (magent-store--session-deadline session))
            (should-not (magent-store--session-deadline session))
            (should (> (magent-store--session-fill session) 0)))
        (signal-process pid 'SIGCONT))
      (should (magent-store-recovery-edges-test--wait
               (lambda () (= (magent-store--unsaved session) 0)) 10))
      (should (equal (magent-store-recovery-edges-test--on-disk "s-behind")
                     "<in flight><a><b>")))))

(ert-deftest magent-store-a-restart-is-said-saved-only-once-every-session-is ()
  "After a restart, the message that everything is saved again comes once
the last session is reopened and has its entries saved, not when the
first one is; a session with nothing unsaved is reopened and sent no batch."
  (magent-store-test--with-backend
    (let ((magent-store-recovering nil)
          (magent-store-flush-interval 3600.0)
          (said nil))
      (magent-store-open "s-saved")
      (magent-store-test--session "s-late")
      (magent-store-flush "s-saved")
      (let* ((saved (gethash "s-saved" magent-store--sessions))
             (late (gethash "s-late" magent-store--sessions))
             (saved-flushes (magent-store--session-flushes saved))
             (killed magent-store-current-backend))
        (cl-letf (((symbol-function 'message)
                   (lambda (format &rest args)
                     (let ((text (apply #'format-message format args)))
                       (when (string-match-p "restarted; everything it had not saved" text)
                         ;; What every session holds when the message comes.
                         (push (list (magent-store--session-opened saved)
                                     (magent-store--unsaved saved)
                                     (magent-store--session-opened late)
                                     (magent-store--unsaved late))
                               said))))))
          (signal-process (magent-store-backend-pid killed) 'SIGKILL)
          ;; Queued while the backend restarts: sent once s-late is reopened.
          (magent-store-append-item-content "s-late" "item-1" "after the kill")
          (should (magent-store-recovery-edges-test--wait
                   (lambda () (and said (not magent-store-recovering))) 30)))
        (should (equal said '((t 0 t 0))))
        (should (= (magent-store--session-flushes saved) saved-flushes))
        (should (equal (magent-store-recovery-edges-test--on-disk "s-late")
                       "after the kill"))))))

(ert-deftest magent-store-a-session-opened-without-waiting-knows-where-its-log-ends ()
  "A session opened without waiting, whose log already holds events, takes
its last seq from the backend's answer: opening it again returns it."
  (magent-store-test--with-backend
    (magent-store-open "s-known")
    (magent-store-test--start-turn "s-known")
    (should (= (magent-store-flush "s-known") 3))
    (magent-store-close "s-known")
    (let ((session (magent-store-ensure-session "s-known" 'global)))
      (should (magent-store-recovery-edges-test--wait
               (lambda () (magent-store--session-opened session)) 30))
      (should (= (magent-store-open "s-known") 3)))))

(ert-deftest magent-store-a-refusal-is-said-once-and-named-as-the-last-error ()
  "A batch the backend cannot write (its log may not grow) is refused,
and the batch sent after it is refused for coming before it: the user
is told once, of the first refusal, and the last error names it too."
  (magent-store-test-with-backend
      ((magent-store-python (magent-store-recovery-edges-test--small-disk-python))
       (magent-store-test-stop-argument '(4))
       (magent-store-retry-interval 3600)
       (messages nil))
    (let ((session (magent-store-test--session "s-full")))
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (push (apply #'format-message format args) messages))))
        (magent-store-append-item-content "s-full" "item-1" (make-string 100000 ?x))
        (magent-store--tick session)
        (magent-store-append-item-content "s-full" "item-1" "after it")
        (magent-store--tick session)
        (should (= (length (magent-store--session-inflight session)) 2))
        ;; Answered in order: both refusals came before this answer.
        (magent-store-call "status" nil))
      (let ((said (cl-remove-if-not (lambda (m) (string-match-p "is not saved" m))
                                    messages)))
        (should (= (length said) 1))
        (should (string-match-p "File too large" (car said)))
        (should-not (string-match-p "came before batch" (car said))))
      (should (string-match-p "File too large" magent-store-last-error))
      (should (= (magent-store--unsaved session) 2)))))

(ert-deftest magent-store-a-forgotten-session-is-not-sent-again-at-its-retry ()
  "A session refused, then forgotten before its retry: the retry sends
nothing, and the backend does not open it again."
  (magent-store-test--with-backend
    (let ((magent-store-retry-interval 0.5))
      (magent-store-test--session "s-dropped")
      ;; Closed in the backend, behind the shim's back: the next batch is refused.
      (magent-store-call "close" (list "s-dropped"))
      (let ((session (gethash "s-dropped" magent-store--sessions))
            retry)
        (magent-store-append-item-content "s-dropped" "item-1" "never saved")
        (magent-store-request-flush "s-dropped")
        (should (magent-store-recovery-edges-test--wait
                 (lambda () (magent-store--session-retry session)) 30))
        (setq retry (magent-store--session-retry session))
        (magent-store-forget "s-dropped")
        (should (magent-store-recovery-edges-test--wait
                 (lambda () (not (memq retry timer-list))) 30))
        ;; Answered in order: whatever the retry sent came before this.
        (should-not (member "s-dropped" (magent-store-recovery-edges-test--open-sessions)))))))

(ert-deftest magent-store-a-call-right-after-the-backend-died-starts-the-only-next-one ()
  "A call made once the backend died, before its recovery ran, starts the
next backend itself: the sessions are opened on it, a flush saves, and
the recovery then starts no other backend."
  (magent-store-test--with-backend
    (let ((magent-store-recovering nil))
      (magent-store-test--session "s-race")
      (let ((dead magent-store-current-backend)
            next)
        (signal-process (magent-store-backend-pid dead) 'SIGKILL)
        ;; Its connection closes: the shim knows it stopped.  No timer
        ;; runs meanwhile, so its recovery has not run yet.
        (with-timeout (30 (ert-fail "the backend's stop was never noticed"))
          (while (not (magent-store-backend-stopping dead))
            (accept-process-output (magent-store-backend-connection dead) 0.05 nil 1)))
        (should (eq magent-store-current-backend dead))
        (magent-store-append-item-content "s-race" "item-1" "after the kill")
        (should (= (magent-store-flush "s-race") 4))
        (setq next magent-store-current-backend)
        (should-not (eq next dead))
        ;; Now the recovery runs: it starts no other backend.
        (should (magent-store-recovery-edges-test--wait
                 (lambda () (not (cl-find 'magent-store--recover timer-list
                                          :key #'timer--function)))
                 30))
        (should (eq magent-store-current-backend next))
        (should (equal (magent-store-recovery-edges-test--open-sessions) '("s-race")))
        (should (equal (magent-store-recovery-edges-test--on-disk "s-race")
                       "after the kill"))))))

(provide 'magent-store-recovery-edges-tests)
;;; magent-store-recovery-edges-tests.el ends here
