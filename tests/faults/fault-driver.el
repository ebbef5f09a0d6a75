;;; fault-driver.el --- One Emacs streaming through the shim while faults strike  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Run by tests/faults/faults.py in `emacs --batch': the real shim, its real
;; backend, real timers.  The harness kills backends, fills disks and
;; frees them; this file only streams and reports.  Settings come from
;; the environment (FAULT_*), the result goes to FAULT_OUT as JSON:
;; chunks sent, restarts seen, the longest any shim function ran while
;; recovering and the longest Emacs stalled, the shim's messages.
;;
;; Each chunk is "<N>" plus filler, N counting from 0: the harness
;; reads the content back and counts lost, duplicated and reordered N.

;;; Code:

(require 'cl-lib)
(unless (locate-library "epc")
  (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path dir)))
(require 'magent-store)

(defun fault--env (name &optional default)
  "Return environment variable NAME, or DEFAULT."
  (let ((value (getenv name)))
    (if (and value (not (string-empty-p value))) value default)))

(defun fault--num (name default)
  "Return environment variable NAME as a number, or DEFAULT."
  (let ((value (fault--env name)))
    (if value (string-to-number value) default)))

(defvar fault--messages nil "The shim's messages, newest first.")
(defvar fault--max-call-ms 0.0
  "Longest single call of a recovery function, its garbage collection excluded.")
(defvar fault--slowest nil "Which function that was.")
(defvar fault--max-gc-ms 0.0 "Longest garbage collection inside one such call.")
(defvar fault--max-raw-ms 0.0 "Longest such call, garbage collection included.")
(defvar fault--recoveries 0 "How many times the shim started a new backend after a death.")
(defvar fault--calls (make-hash-table :test #'eq)
  "Function -> longest call in ms, once the first backend was up.")

(defun fault--capture (format-string &rest args)
  "Keep what `message' shows with FORMAT-STRING and ARGS."
  (when (and (stringp format-string) (string-prefix-p "magent-store" format-string))
    (push (apply #'format-message format-string args) fault--messages))
  (when (and (equal format-string "%s") (stringp (car args))
             (string-prefix-p "magent-store" (car args)))
    (push (car args) fault--messages)))

(defvar fault--failed-writes 0
  "Writes to the backend's socket that failed because the backend was gone.
Each one would have killed a batch Emacs whose SIGPIPE is at its default.")

(defun fault--count-failed-write (orig &rest args)
  "Call ORIG with ARGS, counting a write that found the backend gone."
  (condition-case err
      (apply orig args)
    (error
     (when (string-match-p "no longer connected to pipe" (error-message-string err))
       (cl-incf fault--failed-writes))
     (signal (car err) (cdr err)))))

(defun fault--timed (name)
  "Return advice timing each call of the function NAME."
  (lambda (orig &rest args)
    (let ((start (float-time))
          (gc gc-elapsed))
      (prog1 (apply orig args)
        (let* ((gc-ms (* 1000 (- gc-elapsed gc)))
               (ms (* 1000 (- (float-time) start))))
          (when (> gc-ms fault--max-gc-ms)
            (setq fault--max-gc-ms gc-ms))
          ;; The first start (loading epc.el, say) is not a restart.  A
          ;; garbage collection may strike in any call, ours or not: the
          ;; baseline run shows its pauses, so it is counted apart.
          (when (> fault--recoveries 0)
            (puthash name (max (- ms gc-ms) (gethash name fault--calls 0)) fault--calls)
            (setq fault--max-raw-ms (max ms fault--max-raw-ms))
            (when (> (- ms gc-ms) fault--max-call-ms)
              (setq fault--max-call-ms (- ms gc-ms) fault--slowest name))))))))

(defun fault--event (type &rest fields)
  "A journal event alist of TYPE with FIELDS (a plist)."
  `((seq) (type . ,type) (thread-id . "thread-1")
    (turn-id . ,(plist-get fields :turn-id))
    (item-id . ,(plist-get fields :item-id))
    (payload . ,(plist-get fields :payload))
    (created-at . ,(float-time))))

(defun fault--start-turn (sid item)
  "Journal a thread, a turn and an assistant ITEM in SID."
  (let ((now (float-time)))
    (magent-store-append-event sid (fault--event "thread-started"))
    (magent-store-append-event
     sid (fault--event "turn-started" :turn-id "turn-1"
                       :payload `((turn . ((id . "turn-1") (input . "go")
                                           (status . "in-progress")
                                           (queued-at . ,now) (items . []))))))
    (magent-store-append-event
     sid (fault--event "item-started" :turn-id "turn-1" :item-id item
                       :payload `((item . ((id . ,item) (turn-id . "turn-1")
                                           (type . "message") (role . "assistant")
                                           (status . "in-progress")
                                           (created-at . ,now)
                                           (updated-at . ,now))))))))

(defun fault--progress (file text)
  "Write TEXT to FILE (the harness polls it)."
  (let ((coding-system-for-write 'utf-8-unix))
    (write-region text nil file nil 'silent)))

;; A random kill that lands just before the shim writes twice to the
;; backend's socket, with nothing read in between (resending the batches
;; a restarted backend has not saved, say): the first write is answered
;; by a reset from the kernel, and the second one fails with EPIPE.
;; FAULT_KILL_AT=N strikes there at chunk N, every time: each step waits
;; for what the kernel says of the connection, never for luck.

(defun fault--tcp-state (connection)
  "CONNECTION's TCP state as the kernel lists it (hex, \"01\" established).
Nil once the kernel lists it no more (closed).  Reads no process output.
The line is found by both ports: an earlier connection that used the same
local port may still be listed (TIME_WAIT), with another remote port."
  (let ((port (aref (process-contact connection :local) 4))
        (remote (aref (process-contact connection :remote) 4)))
    (with-temp-buffer
      ;; One read of a /proc file stops at 16 KB: read on until nothing comes.
      (let ((at 0) read)
        (while (> (setq read (cadr (insert-file-contents "/proc/net/tcp" nil at
                                                         (+ at 65536))))
                  0)
          (goto-char (point-max))
          (setq at (+ at read))))
      (goto-char (point-min))
      (and (re-search-forward
            (format "^ *[0-9]+: [0-9A-F]+:%04X [0-9A-F]+:%04X \\([0-9A-F]+\\)"
                    port remote)
            nil t)
           (match-string 1)))))

(defun fault--wait-tcp (connection predicate)
  "Wait (reading nothing) until PREDICATE holds of CONNECTION's TCP state."
  (let ((deadline (+ (float-time) 10)))
    (while (and (not (funcall predicate (fault--tcp-state connection)))
                (< (float-time) deadline)))))

(defun fault--drain (sid)
  "Save SID and wait until the backend answered every call sent to it.
A process killed with bytes it never read makes the kernel reset the
connection at once, so Emacs's next write would fail: the second send
would then be the third.  A backend that has read everything closes it
with a FIN, and only the write after it draws the reset."
  (magent-store-flush sid)
  (let ((connection (magent-store-backend-connection magent-store-current-backend))
        (replies (magent-store-backend-replies magent-store-current-backend))
        (deadline (+ (float-time) 30)))
    (while (and (> (hash-table-count replies) 0) (< (float-time) deadline))
      (accept-process-output connection 0.05 nil 1))
    (unless (zerop (hash-table-count replies))
      (error "Fault driver: the backend left %d calls unanswered"
             (hash-table-count replies)))))

(defun fault--kill-backend (connection)
  "SIGKILL the backend and wait until the kernel closed its end of CONNECTION.
Emacs reads nothing meanwhile: its connection still looks live."
  (unless (equal (fault--tcp-state connection) "01")
    (error "Fault driver: /proc/net/tcp does not list the connection as established"))
  (signal-process (process-id (magent-store-backend-process magent-store-current-backend))
                  'KILL)
  ;; 08: CLOSE_WAIT, the backend's end is closed.
  (fault--wait-tcp connection (lambda (state) (not (equal state "01")))))

(defun fault--saved-p (sid)
  "Non-nil once every entry of SID is saved (the backend said so)."
  (let ((session (gethash sid magent-store--sessions)))
    (and session
         (zerop (magent-store--session-fill session))
         (null (magent-store--session-inflight session)))))

(defun fault-run ()
  "Stream FAULT_CHUNKS chunks into FAULT_SESSION, then save and stop."
  (let* ((sid (fault--env "FAULT_SESSION" "s-fault"))
         (item (fault--env "FAULT_ITEM" "item-1"))
         (chunks (fault--num "FAULT_CHUNKS" 1000))
         (interval (fault--num "FAULT_INTERVAL" 0.005))
         (filler (make-string (fault--num "FAULT_FILLER" 40) ?x))
         (progress (fault--env "FAULT_PROGRESS"))
         (out (fault--env "FAULT_OUT"))
         (settle (fault--num "FAULT_SETTLE" 60))
         (kill-at (and (fault--env "FAULT_KILL_AT") (fault--num "FAULT_KILL_AT" 0)))
         connection         ; the backend's, killed at chunk KILL-AT
         after-kill         ; its state after each of the two sends
         (max-stall 0.0)
         (start (float-time))
         stopped-cleanly stop-error)
    (setq magent-store-root (fault--env "FAULT_ROOT")
          magent-store-python (fault--env "FAULT_PYTHON" magent-store-python)
          magent-store-restart-limit 100000
          magent-store-retry-interval (fault--num "FAULT_RETRY" 0.3)
          magent-store-log-max-events (fault--num "FAULT_LOG_MAX" 2000)
          ;; FAULT_REDACT: write-time redaction on.  Every chunk then ends
          ;; in "x", the start of a Slack token: the backend holds it back,
          ;; and every batch is released one batch late.
          magent-store-redact (and (fault--env "FAULT_REDACT") t)
          magent-store-call-timeout 30)
    (advice-add 'message :before #'fault--capture)
    (advice-add 'process-send-region :around #'fault--count-failed-write)
    (advice-add 'magent-store--recover :before
                (lambda (&rest _) (cl-incf fault--recoveries)))
    (dolist (name '(magent-store--recover magent-store--start-backend
                    magent-store--server-output magent-store--filter
                    magent-store--retry magent-store--tick
                    magent-store--sentinel magent-store--flush-now
                    magent-store--reopen magent-store--resend))
      (advice-add name :around (fault--timed name)))
    (if (fault--env "FAULT_ASYNC_OPEN")
        ;; As the mode opens sessions: without waiting, whatever the backend says.
        (magent-store-ensure-session sid 'global)
      (magent-store-open sid))
    (fault--start-turn sid item)
    (when progress (fault--progress progress "0"))
    (dotimes (i chunks)
      (when (eql i kill-at)
        (fault--drain sid)
        (setq connection (magent-store-backend-connection magent-store-current-backend))
        (fault--kill-backend connection))
      (magent-store-append-item-content sid item (format "<%d>%s" i filler))
      (if (and kill-at (<= kill-at i (1+ kill-at)))
          ;; Two batches sent at once, nothing read in between.
          (progn
            (magent-store--flush-now (gethash sid magent-store--sessions))
            (when (= i kill-at)
              ;; The write drew a reset: the kernel forgets the connection.
              (fault--wait-tcp connection #'null))
            ;; A write that failed closed the connection there and then.
            (push (format "%s %s" (process-status connection)
                          (process-exit-status connection))
                  after-kill))
        (magent-store-request-flush sid)
        (let ((before (float-time)))
          (sleep-for interval)
          (setq max-stall (max max-stall (- (float-time) before interval)))))
      (when (and progress (zerop (% i 50)))
        (fault--progress progress (number-to-string i))))
    (when progress (fault--progress progress "done"))
    ;; Let retries and restarts finish: timers run while we sleep.
    (let ((deadline (+ (float-time) settle)))
      (while (and (not (fault--saved-p sid)) (< (float-time) deadline))
        (when (and (magent-store-ready-p magent-store-current-backend)
                   (not (magent-store--session-retry
                         (gethash sid magent-store--sessions))))
          (ignore-errors (magent-store-flush sid)))
        (sleep-for 0.1)))
    (let ((saved (fault--saved-p sid))
          (backend magent-store-current-backend))
      (let ((server (and backend (magent-store-backend-process backend))))
        (condition-case err
            (progn (magent-store-stop)
                   (setq stopped-cleanly
                         (and server (memq (process-status server) '(exit signal))
                              (list (process-status server) (process-exit-status server)))))
          (error (setq stop-error (error-message-string err)))))
      (with-temp-file out
        (insert (json-encode
                 `((chunks . ,chunks)
                   (after-kill . ,(vconcat (reverse after-kill)))
                   (saved . ,(if saved t :json-false))
                   (recoveries . ,fault--recoveries)
                   (failed-writes . ,fault--failed-writes)
                   (max-call-ms . ,fault--max-call-ms)
                   (slowest . ,(format "%s" fault--slowest))
                   (max-gc-ms . ,fault--max-gc-ms)
                   (max-raw-ms . ,fault--max-raw-ms)
                   (gcs . ,gcs-done)
                   (gc-seconds . ,gc-elapsed)
                   (calls . ,(let (l) (maphash (lambda (k v) (push (format "%s %.1f" k v) l))
                                               fault--calls)
                                   (vconcat l)))
                   (max-stall-ms . ,(* 1000 max-stall))
                   (seconds . ,(- (float-time) start))
                   (stop . ,(format "%S" stopped-cleanly))
                   (stop-error . ,stop-error)
                   (messages . ,(vconcat (seq-take (delete-dups (reverse fault--messages)) 40))))))))))

(provide 'fault-driver)
;;; fault-driver.el ends here
