;;; magent-store-connection.el --- The connection to the magent-store backend  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; The connection to the backend, under the core (magent-store.el): the
;; wire (EPC's framing, printed into a reused buffer, and our own
;; dispatch of replies), starting and stopping the backend with its
;; token and the version check, and the backend that does not answer.
;; It knows nothing of sessions.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'magent-store-print)
(require 'magent-store-program)

;; The core (magent-store.el) requires this file and tells it, through
;; the three functions below, what to do with its sessions.
(declare-function magent-store-install-backend "magent-store-install")
(defvar magent-store-version)
(declare-function magent-store-flush-all "magent-store")
(declare-function magent-store-unsaved-count "magent-store")
(declare-function magent-store-forget-all "magent-store")

(defvar magent-store-ready-function #'ignore
  "Function of no argument called once the running backend took our token.
The core sets it: it opens every session the backend does not hold yet.")

(defvar magent-store-answering-function #'ignore
  "Function of no argument called when a backend taken to be hung answers.
The core sets it: it sends what its sessions queued meanwhile.")

(defvar magent-store-detach-function #'ignore
  "Function of no argument called when the backend goes away or restarts.
The core sets it: it forgets that its sessions are open on a backend
and cancels their timers.")

;; epc.el is checked for when the backend starts, so that this file loads
;; (and byte-compiles) without it and a missing epc.el is reported clearly.
;; The shim speaks EPC's framing itself: starting through `epc:start-epc'
;; would block Emacs while the backend starts.

;;;; Customization

(defgroup magent-store nil
  "Persist magent sessions through the magent-store backend."
  :group 'tools
  :prefix "magent-store-")

(define-error 'magent-store-error "magent-store")

(defun magent-store-signal (format-string &rest args)
  "Signal `magent-store-error' with FORMAT-STRING applied to ARGS."
  (signal 'magent-store-error (list (apply #'format-message format-string args))))

(defcustom magent-store-file-threshold (* 512 1024)
  "Batches larger than this many bytes travel as a private file.
Escaping megabytes into an EPC message costs Emacs far more than
writing them to a file the backend reads."
  :type 'natnum
  :group 'magent-store)

(defcustom magent-store-call-timeout 10
  "Seconds a synchronous call waits for the backend before giving up.
A backend that lets one call time out is taken to be hung: the calls
after it fail at once, until it answers again."
  :type 'number
  :group 'magent-store)

(cl-defstruct (magent-store-backend (:constructor magent-store-backend-make)
                                     (:copier nil))
  "One backend and our connection to it.
PROCESS is the backend's process, CONNECTION our socket to it (nil
until it announced its port), READY non-nil once it took our TOKEN,
FAILURE why it could not start, OUTPUT what it printed before its port.
UNRESPONSIVE is when a call waiting for it timed out, until it answers
again; meanwhile nothing is sent to it and waiting calls fail at once."
  process connection pid port spool started-at token output ready failure
  program unresponsive
  (next-id 0)
  (replies (make-hash-table :test #'eql))
  stopping)

(defvar magent-store-current-backend nil
  "The running backend, or nil.")

(defvar magent-store-last-error nil
  "The last error the backend or the shim reported, for the status buffer.")

;;;; The wire (EPC framing, our own cheap dispatch)

(defvar magent-store--send-buffer nil
  "Buffer messages are printed into, reused so that sending allocates little.")

(defmacro magent-store--with-send-buffer (&rest body)
  "Run BODY in the emptied send buffer."
  (declare (indent 0) (debug t))
  ;; No buffer hooks: each insert would otherwise cons for the change
  ;; functions, and nothing watches this buffer.
  `(with-current-buffer
       (if (buffer-live-p magent-store--send-buffer)
           magent-store--send-buffer
         (setq magent-store--send-buffer
               (generate-new-buffer " *magent-store-send*" t)))
     (let ((inhibit-modification-hooks t))
       (erase-buffer)
       (set-buffer-multibyte t)
       ,@body)))

(defun magent-store-send (method args &optional on-reply on-error printer)
  "Call METHOD with ARGS on the backend without waiting.
ON-REPLY gets the value, ON-ERROR the error message.  Signal an error
when there is no live backend.  The message is printed into a reused
buffer and sent from there: no string as large as the message is made.
PRINTER, when non-nil, is called with ARGS to print them at point
instead of `prin1' (a batch prints itself from its vector)."
  (let* ((backend (or magent-store-current-backend
                      (error "The magent-store backend is not running")))
         (id (cl-incf (magent-store-backend-next-id backend))))
    (when (or on-reply on-error)
      (puthash id (cons on-reply on-error)
               (magent-store-backend-replies backend)))
    (magent-store--with-send-buffer
      (if (not printer)
          (magent-store-print (list 'call id (intern method) args))
        (insert "(call ")
        (prin1 id (current-buffer))
        (insert " " method " ")
        (funcall printer args)
        (insert ")"))
      (insert "\n")
      ;; Emacs keeps text as UTF-8, raw bytes aside, and printing left
      ;; none: made unibyte, the buffer holds the message's UTF-8 bytes
      ;; and is sent from where it lies.  Encoding instead, or sending
      ;; multibyte text, would copy the whole message first.
      (set-buffer-multibyte nil)
      (goto-char (point-min))
      (insert (format "%06x" (buffer-size)))
      (process-send-region (magent-store-backend-connection backend)
                           (point-min) (point-max)))
    id))

(defun magent-store--filter (process output)
  "Collect OUTPUT from PROCESS and dispatch every complete reply."
  (let ((buffer (process-buffer process)))
    (when (buffer-live-p buffer)
      (with-current-buffer buffer
        (goto-char (point-max))
        (insert output)
        (let ((backend (process-get process 'magent-store-backend))
              message)
          (while (setq message (magent-store--next-message))
            (magent-store--dispatch backend message)))))))

(defun magent-store--next-message ()
  "Remove and return the next complete message in this buffer, or nil."
  (when (>= (buffer-size) 6)
    (let ((length (string-to-number
                   (buffer-substring-no-properties 1 7) 16)))
      (when (>= (- (buffer-size) 6) length)
        (prog1 (car (read-from-string
                     (decode-coding-string
                      (buffer-substring-no-properties 7 (+ 7 length))
                      'utf-8-unix)))
          (delete-region 1 (+ 7 length)))))))

(defun magent-store--dispatch (backend message)
  "Run the callback of BACKEND that MESSAGE answers."
  (let* ((kind (car message))
         (id (nth 1 message))
         (replies (and backend (magent-store-backend-replies backend)))
         (handlers (and replies (gethash id replies))))
    (when handlers (remhash id replies))
    (when (and backend (magent-store-backend-unresponsive backend))
      (magent-store--answering backend))
    (pcase kind
      ('return (when (car handlers) (funcall (car handlers) (nth 2 message))))
      ((or 'return-error 'epc-error)
       (let ((text (format "%s" (nth 2 message))))
         (setq magent-store-last-error text)
         (if (cdr handlers)
             (funcall (cdr handlers) text)
           (message "magent-store: %s" text)))))))

(defun magent-store-call (method args)
  "Call METHOD with ARGS and wait for the value; signal on error.
No timers run while it waits: nothing re-enters the shim.  A backend
that does not answer in time is taken to be hung (see
`magent-store-unanswered')."
  (let* ((done nil) value failure
         (backend (magent-store-ready-backend))
         (process (magent-store-backend-connection backend))
         (deadline (+ (float-time) magent-store-call-timeout)))
    (magent-store-check-answering backend method)
    (magent-store-send method args
                        (lambda (v) (setq value v done t))
                        (lambda (e) (setq failure e done t)))
    (while (and (not done) (process-live-p process)
                (< (float-time) deadline))
      ;; JUST-THIS-ONE an integer: no timers, no other process's output.
      (accept-process-output process 0.05 nil 1))
    (cond (failure (magent-store-signal "%s: %s" method failure))
          (done value)
          ((not (process-live-p process))
           (magent-store-signal "The backend died during %s" method))
          (t (magent-store-signal "%s: %s" method
                                  (magent-store-unanswered backend))))))

;;;; A backend that does not answer

;; A backend can hang (stopped, or stuck on a disk) without dying.  The
;; first call that waits for it in vain costs `magent-store-call-timeout';
;; after that, waiting calls fail at once and nothing more is sent (a
;; socket full of batches would block Emacs), until a reply shows that
;; it answers again.  Entries queue in Emacs meanwhile, as always.

(defun magent-store--restart-hint ()
  "Return how to restart the backend, for a message."
  (substitute-command-keys "\\[magent-store-restart] restarts it"))

(defun magent-store-unanswered (backend)
  "Mark BACKEND as not answering; return what to tell the user."
  (unless (magent-store-backend-unresponsive backend)
    (setf (magent-store-backend-unresponsive backend) (float-time)))
  (setq magent-store-last-error
        (format "the backend (pid %s) did not answer within %ss; until it \
does, nothing more is sent to it and unsaved entries stay in Emacs (%s)"
                (magent-store-backend-pid backend) magent-store-call-timeout
                (magent-store--restart-hint))))

(defun magent-store-check-answering (backend what)
  "Signal at once, naming WHAT, when BACKEND is known not to answer."
  (when-let ((since (magent-store-backend-unresponsive backend)))
    (magent-store-signal
     "%s: the backend (pid %s) is not answering (for %.0fs); unsaved \
entries stay in Emacs; %s"
     what (magent-store-backend-pid backend) (- (float-time) since)
     (magent-store--restart-hint))))

(defun magent-store--answering (backend)
  "BACKEND, taken to be hung, answered: send what queued meanwhile.
A header put meanwhile goes first (the backend writes it only if it
changed); a session waiting for a retry sends at its retry."
  (setf (magent-store-backend-unresponsive backend) nil)
  (message "magent-store: the backend answers again; what Emacs kept \
meanwhile is being saved")
  (funcall magent-store-answering-function))

;;;; Starting and stopping the backend

(defvar magent-store--token-key nil
  "Secret bytes (hex) read from /dev/urandom once; tokens are derived from it.")

(defvar magent-store--token-count 0
  "Tokens derived so far: each one differs.")

(defun magent-store--token ()
  "Return a fresh token (64 hex digits) that no other process can guess.
The system's randomness is read once, by a subprocess; every later
token (a restart) is a hash of it and a counter, so that restarting
never waits for a subprocess."
  (unless magent-store--token-key
    (let ((bytes (with-temp-buffer
                   (set-buffer-multibyte nil)
                   (ignore-errors
                     (let ((coding-system-for-read 'binary))
                       (call-process "head" "/dev/urandom" t nil "-c" "64")))
                   (buffer-string))))
      (setq magent-store--token-key
            (if (= (length bytes) 64)
                (mapconcat (lambda (byte) (format "%02x" byte)) bytes "")
              ;; No /dev/urandom: Emacs's own generator, seeded from the system.
              (secure-hash 'sha256 (format "%s %s %s %s" (random t) (random)
                                           (float-time) (emacs-pid)))))))
  (secure-hash 'sha256 (format "%s %d %s" magent-store--token-key
                               (cl-incf magent-store--token-count)
                               (float-time))))

(defun magent-store-save-at-exit ()
  "Flush everything before Emacs exits."
  (when magent-store-current-backend
    (condition-case err
        (magent-store-stop)
      (error (message "magent-store: flush at exit failed: %s"
                      (error-message-string err))))))

(defun magent-store--start-backend ()
  "Start the backend without waiting for it; return the backend.
The backend announces its port on stdout; our filter then connects and
authenticates, and once the token is accepted every open session is
reopened and what it had not saved is sent again.  Nothing here waits:
chunks keep queueing meanwhile.  `magent-store--wait-ready' waits."
  ;; Found, not loaded: the shim needs none of its code, and loading it
  ;; would block Emacs for a tenth of a second.
  (unless (locate-library "epc")
    (user-error "Magent-store needs epc.el: M-x package-install RET epc \
\(MELPA), or your distribution's package (Debian: elpa-epc)"))
  (let* ((command (magent-store-program-command))
         (token (magent-store--token))
         (backend (magent-store-backend-make :started-at (float-time)
                                              :token token
                                              :program (car command)))
         (process-environment
          (cons (concat "MAGENT_STORE_TOKEN=" token) process-environment))
         (server
          (condition-case err
              (make-process
               :name "magent-store" :command command :noquery t
               ;; A pipe, not a pty: the backend never reads a terminal.
               :connection-type 'pipe :coding 'utf-8-unix
               :filter (lambda (process output)
                         (magent-store--server-output backend process output))
               :sentinel #'magent-store--sentinel)
            (error
             (user-error "Could not start %s: %s (see `magent-store-python')"
                         (mapconcat #'identity command " ")
                         (error-message-string err))))))
    (setf (magent-store-backend-process backend) server)
    (setq magent-store-current-backend backend)
    (add-hook 'kill-emacs-hook #'magent-store-save-at-exit)
    backend))

(defun magent-store--server-output (backend process output)
  "Read BACKEND's port from PROCESS's OUTPUT, then connect and authenticate."
  (unless (magent-store-backend-connection backend)
    (setf (magent-store-backend-output backend)
          (concat (magent-store-backend-output backend) output))
    (let ((text (magent-store-backend-output backend)))
      (if (string-match "^\\([0-9]+\\)\n" text)
          (condition-case err
              (magent-store--connect backend
                                     (string-to-number (match-string 1 text)))
            (error
             (setf (magent-store-backend-failure backend)
                   (format "cannot connect to the backend: %s"
                           (error-message-string err)))
             (delete-process process)))
        (when (> (length text) 4096)
          ;; Not a port: say what it printed (a traceback, say) and stop.
          (setf (magent-store-backend-failure backend)
                (format "the backend printed no port: %s"
                        (substring text 0 200)))
          (delete-process process))))))

(defun magent-store--connect (backend port)
  "Connect to BACKEND on 127.0.0.1:PORT and send the token."
  (let ((connection
         (make-network-process
          :name "magent-store-connection" :host "127.0.0.1" :service port
          :buffer (generate-new-buffer " *magent-store-connection*" t)
          :coding '(binary . utf-8-unix) :noquery t
          :filter #'magent-store--filter :sentinel #'magent-store--sentinel)))
    ;; The filter finds its backend from the connection, not from a
    ;; global: a connection's replies belong to the backend that made it.
    (process-put connection 'magent-store-backend backend)
    (with-current-buffer (process-buffer connection)
      (set-buffer-multibyte nil))
    (setf (magent-store-backend-connection backend) connection
          (magent-store-backend-port backend) port)
    (magent-store-send
     "auth" (list (magent-store-backend-token backend))
     (lambda (reply)
       (setf (magent-store-backend-spool backend) (nth 0 reply)
             (magent-store-backend-pid backend) (nth 1 reply)
             (magent-store-backend-token backend) nil
             (magent-store-backend-ready backend) t)
       (magent-store--check-version (nth 2 reply)
                                    (magent-store-backend-program backend))
       (magent-store--backend-ready-hook backend))
     (lambda (why)
       (setf (magent-store-backend-failure backend)
             (format "the backend refused the token: %s" why))
       (delete-process connection)))))

(defun magent-store--backend-ready-hook (backend)
  "BACKEND took our token: open every session it does not hold yet."
  (when (eq backend magent-store-current-backend)
    (funcall magent-store-ready-function)))

(defun magent-store-ready-p (backend)
  "Non-nil when BACKEND is authenticated and not stopping."
  (and backend (magent-store-backend-ready backend)
       (not (magent-store-backend-stopping backend))
       (process-live-p (magent-store-backend-connection backend))))

(defun magent-store--wait-ready (backend)
  "Wait until BACKEND is ready, running no timers; signal if it cannot be."
  (let ((deadline (+ (float-time) magent-store-call-timeout)))
    (while (and (not (magent-store-backend-ready backend))
                (not (magent-store-backend-stopping backend))
                (< (float-time) deadline))
      (let ((connection (magent-store-backend-connection backend)))
        ;; JUST-THIS-ONE an integer: no timers run, nothing re-enters us.
        (accept-process-output (if (process-live-p connection)
                                   connection
                                 (magent-store-backend-process backend))
                               0.05 nil 1)))
    (unless (magent-store-ready-p backend)
      (magent-store-signal
       "The backend did not start: %s (see `magent-store-python' and %s)"
       (or (magent-store-backend-failure backend)
           (if (magent-store-backend-stopping backend)
               "it exited"
             (format "no answer within %ss" magent-store-call-timeout)))
       (expand-file-name "server.log" (magent-store-log-directory))))
    backend))

(defun magent-store--check-version (version program)
  "Say so when the backend PROGRAM reports VERSION, not ours."
  (unless (equal version magent-store-version)
    (setq magent-store-last-error
          (format "the backend (%s) %s, this package is version %s: \
M-x magent-store-install-backend installs the matching backend"
                  program
                  (if version (format "is version %s" version)
                    "is too old to report its version")
                  magent-store-version))
    (display-warning 'magent-store magent-store-last-error)))

(defun magent-store--await-exit (backend)
  "Give BACKEND, asked to shut down, up to 3 s to exit by itself.
Its cleanup (closing sessions, removing its spool directory) runs
just before it exits: killed earlier, it leaves the spool behind."
  (let ((process (magent-store-backend-process backend))
        (deadline (+ (float-time) 3)))
    (while (and (process-live-p process) (< (float-time) deadline))
      ;; JUST-THIS-ONE an integer: no timers or other filters run.
      (accept-process-output process 0.05 nil 1))))

(defun magent-store--kill-backend (backend)
  "Forget BACKEND and make sure its processes are gone."
  (when backend
    (setf (magent-store-backend-stopping backend) t)
    (when (eq magent-store-current-backend backend)
      (setq magent-store-current-backend nil))
    (let ((connection (magent-store-backend-connection backend)))
      (when (processp connection)
        (delete-process connection)
        (when (buffer-live-p (process-buffer connection))
          (kill-buffer (process-buffer connection)))))
    (when (process-live-p (magent-store-backend-process backend))
      (delete-process (magent-store-backend-process backend)))))

(defun magent-store-ensure-backend ()
  "Return the backend, starting it (without waiting) when there is none.
One that stopped is replaced at once, before its recovery has run: its
sessions are then open on no backend, and the new one reopens them."
  (let ((backend magent-store-current-backend))
    (if (and backend (not (magent-store-backend-stopping backend)))
        backend
      (when backend (funcall magent-store-detach-function))
      (magent-store--start-backend))))

(defun magent-store-ready-backend ()
  "Return the backend once it is ready, starting it and waiting if needed."
  (magent-store--wait-ready (magent-store-ensure-backend)))

(defun magent-store--sentinel (process _event)
  "Notice that PROCESS, part of the backend, went away."
  (let ((backend magent-store-current-backend))
    (when (and backend
               (not (magent-store-backend-stopping backend))
               (memq process (list (magent-store-backend-connection backend)
                                   (magent-store-backend-process backend)))
               (not (process-live-p process)))
      (setf (magent-store-backend-stopping backend) t)
      ;; Outside the sentinel, which may run inside a send of ours.
      (run-at-time 0 nil #'magent-store--recover backend))))

(defun magent-store-log-directory ()
  "Return where the backend logs."
  (expand-file-name "magent-store"
                    (or (getenv "XDG_STATE_HOME") "~/.local/state")))

(defun magent-store-shutdown (backend)
  "Ask BACKEND to stop, and wait (a few seconds at most) until it has exited.
It closes every session and removes its spool itself: it is killed only
if it does not exit in time."
  (setf (magent-store-backend-stopping backend) t)
  (when (magent-store-backend-ready backend)
    (ignore-errors (magent-store-send "shutdown" nil #'ignore #'ignore)))
  (magent-store--await-exit backend)
  (magent-store--kill-backend backend))


;;;; Restarting a backend that stopped

(defvar magent-store--restarts nil
  "Times of automatic restarts, newest first.")

(defvar magent-store-stops nil
  "Unexpected stops of the backend in this Emacs: (COUNT TIME WHY), or nil.")

(defvar magent-store-gave-up nil
  "Non-nil once the shim told the user it could not keep the backend up.")

(defvar magent-store-recovering nil
  "When the backend last died, until every session is saved again; or nil.")



(defcustom magent-store-restart-limit 3
  "Automatic restarts of the backend allowed within a minute.
Past that the shim stops restarting it and says so; unsaved changes
stay in Emacs until \\[magent-store-restart]."
  :type 'natnum
  :group 'magent-store)

(defun magent-store--recover (backend)
  "Start a new backend after BACKEND died; reopen and resend asynchronously.
Every timer of every session is cancelled first: nothing is sent until
the new backend has reopened the session and taken what it had not
saved, in order; chunks keep queueing meanwhile.  When a call already
started the next backend (`magent-store-ensure-backend'), that one
reopens the sessions: no other is started."
  (magent-store--note-stop backend)
  (magent-store--kill-backend backend)
  (unless magent-store-current-backend
    (magent-store--restart-after-stop)))

(defun magent-store--restart-after-stop ()
  "Start a new backend after the running one stopped, within the restart limit."
  (funcall magent-store-detach-function)
  (let ((recent (cl-remove-if (lambda (time) (< time (- (float-time) 60)))
                              magent-store--restarts)))
    (setq magent-store--restarts recent)
    (if (or magent-store-gave-up
            (>= (length recent) magent-store-restart-limit))
        (magent-store-give-up
         (cond ((< magent-store-restart-limit 1)
                ;; Quoted as the echo area and the status buffer show it.
                (format-message "the backend stopped, and automatic \
restarts are off (`magent-store-restart-limit' is 0)"))
               (recent (format "the backend stopped %d times within a minute"
                               (1+ (length recent))))
               (t "the backend stopped")))
      (push (float-time) magent-store--restarts)
      (setq magent-store-recovering (float-time))
      (condition-case err
          (magent-store--start-backend)
        (error (magent-store-give-up (error-message-string err)))))))

(defun magent-store--note-stop (backend)
  "Count that BACKEND stopped unexpectedly, with why, for the status buffer."
  (let ((process (magent-store-backend-process backend)))
    (when (process-live-p process)
      ;; The connection closes first; the exit follows within moments.
      (accept-process-output process 0.2 nil 1))
    (setq magent-store-stops
          (list (1+ (or (car magent-store-stops) 0))
                (float-time)
                (pcase (and (processp process) (process-status process))
                  ('signal (format "was killed by signal %d"
                                   (process-exit-status process)))
                  ('exit (format "exited with status %d"
                                 (process-exit-status process)))
                  (_ "closed its connection"))))))

(defun magent-store-give-up (why)
  "Tell the user once that persistence stopped, because of WHY."
  (setq magent-store-last-error why
        magent-store-recovering nil)
  (unless magent-store-gave-up
    (setq magent-store-gave-up t)
    (message "%s" (substitute-command-keys
                   (format "magent-store: %s; unsaved changes are kept in \
Emacs, \\[magent-store-restart] retries (backend log in %s)"
                           why (magent-store-log-directory))))))

;;;; The spool: large batches as files

(defun magent-store-spool-file (backend printer batch fill)
  "Write BATCH's first FILL slots to a new private file in BACKEND's spool.
PRINTER, called with BATCH and FILL, prints them at point.
Return the file's name; signal (and leave no file) if it cannot be written."
  (let ((file (make-temp-file
               (expand-file-name "batch-" (magent-store-backend-spool backend))))
        (coding-system-for-write 'utf-8-unix))
    (magent-store--with-send-buffer
      (funcall printer batch fill)
      (condition-case err
          (with-file-modes #o600
            (write-region (point-min) (point-max) file nil 'silent))
        (error (ignore-errors (delete-file file))
               (signal (car err) (cdr err)))))
    file))

;;;; Commands

;;;###autoload (autoload 'magent-store-start "magent-store" nil t)
(defun magent-store-start (&optional offer-install)
  "Start the backend (if it is not running) and return it.
With OFFER-INSTALL (interactively, always), offer to install the
backend when it is missing; return nil if the user accepts (the
backend starts when the installation is done)."
  (interactive (list t))
  (setq magent-store-gave-up nil)
  (if (and offer-install
           (not (car (magent-store-program)))
           (y-or-n-p "The magent-store backend is not installed.  \
Install it into a private virtualenv now? "))
      (progn
        (magent-store-install-backend
         (lambda (failure) (unless failure (magent-store-start))))
        (message "magent-store: installing the backend (see \
*magent-store-install*); it starts when the installation is done")
        nil)
    (let ((backend (magent-store-ready-backend)))
      (when offer-install
        (message "magent-store: backend pid %s on port %s"
                 (magent-store-backend-pid backend)
                 (magent-store-backend-port backend)))
      backend)))

;;;###autoload (autoload 'magent-store-stop "magent-store" nil t)
(defun magent-store-stop (&optional discard)
  "Flush everything and stop the backend; sessions must be reopened after.
When some entries could not be saved (a full disk, say), nothing is
stopped and an error says so; with DISCARD (a prefix argument) the
backend is stopped all the same and those entries are dropped."
  (interactive "P")
  (let ((running magent-store-current-backend))
    (when running
      (magent-store-flush-all)
      (let ((unsaved (magent-store-unsaved-count)))
        (when (and (> unsaved 0) (not discard))
          (user-error "%d entries are not saved yet (%s); not stopped: \
C-u M-x magent-store-stop drops them" unsaved
                      (or magent-store-last-error "see the backend log"))))
      (funcall magent-store-detach-function)
      (magent-store-shutdown magent-store-current-backend))
    (setq magent-store-recovering nil
          ;; What went wrong before a deliberate stop is no longer news.
          magent-store-last-error nil)
    (let ((count (magent-store-forget-all)))
      (message "magent-store: %s"
               (if running
                   (format "backend stopped, %d session%s flushed"
                           count (if (= count 1) "" "s"))
                 "the backend was not running")))))

;;;###autoload (autoload 'magent-store-restart "magent-store" nil t)
(defun magent-store-restart ()
  "Restart the backend, reopening sessions and resending unsaved entries.
Emacs does not wait: the sessions are reopened once the backend is up."
  (interactive)
  (funcall magent-store-detach-function)
  (when magent-store-current-backend
    (magent-store-shutdown magent-store-current-backend))
  (setq magent-store-gave-up nil
        magent-store--restarts nil
        magent-store-recovering (float-time))
  (magent-store--start-backend)
  (message "magent-store: backend restarting; unsaved entries are sent \
again once it is up"))

(provide 'magent-store-connection)
;;; magent-store-connection.el ends here
