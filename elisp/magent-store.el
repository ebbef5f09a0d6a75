;;; magent-store.el --- Persist magent sessions through the magent-store backend  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Version: 0.1.0
;; Package-Requires: ((emacs "28.1") (epc "0.1.1"))
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

;; A thin shim between magent and the magent-store backend (a Python
;; process speaking EPC on 127.0.0.1).  The backend owns the ledger, the
;; JSONL journal and snapshot compaction; this file owns Emacs and nothing
;; else: it forwards, buffers and schedules.  It holds the connection to
;; the backend, each session's queue and the public functions, and knows
;; only sessions, events, chunks and flushes.  The rest of the package
;; has rooms of its own: the adapter to magent and `magent-store-mode'
;; (magent-store-magent.el, loaded when the mode is first turned on), the
;; status buffer (magent-store-status.el), finding and installing the
;; backend (magent-store-program.el, magent-store-install.el), JSON and
;; printing (magent-store-json.el, magent-store-print.el), search and
;; timing (magent-store-search.el, magent-store-timing.el), and which
;; secrets are kept out of the files (magent-store-redact.el).
;;
;; The hot path is cheap by construction: appending a chunk stores four
;; references in a reused per-session vector (it allocates nothing) and,
;; at most once per `magent-store-flush-interval', the whole batch goes
;; out as ONE message, printed straight from that vector.  Replies are
;; read by our own process filter, with no deferred chains; while chunks
;; stream, the filter sends nothing.  Nothing on the chunk path waits for
;; the backend.
;;
;; Setup:
;;
;;   1. Install epc.el from MELPA (M-x package-install RET epc RET), or
;;      your distribution's package (Debian: elpa-epc).
;;   2. (require 'magent-store) (magent-store-mode 1)
;;   3. M-x magent-store-install-backend, once: it installs the backend
;;      that comes with this package into a private virtualenv under
;;      `user-emacs-directory' (`magent-store-start' offers it too).
;;      A backend installed with pip, or a checkout's .venv after
;;      `make install', is found without it.
;;
;; magent-store has no repository of its own yet: the URL above is
;; magent's, the agent whose sessions it stores.
;;
;; `magent-store-status' shows the backend's state; the backend logs to
;; $XDG_STATE_HOME/magent-store/server.log (~/.local/state/...).

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'json)
(require 'subr-x)
(require 'magent-store-json)
(require 'magent-store-print)
(require 'magent-store-program)
(require 'magent-store-redact)

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

(defun magent-store--error (format-string &rest args)
  "Signal `magent-store-error' with FORMAT-STRING applied to ARGS."
  (signal 'magent-store-error (list (apply #'format-message format-string args))))

(defconst magent-store-version "0.1.0"
  "The version of this package; the backend it talks to should match it.")

(defcustom magent-store-root nil
  "Directory under which sessions are stored (magent's session root).
nil means `magent-session-directory' when magent defines it (looked up
when a session opens, so load order does not matter), else
magent/sessions under `user-emacs-directory'."
  :type '(choice (const :tag "magent's session directory" nil) directory)
  :group 'magent-store)

(defvar magent-store--default-root-function nil
  "Nil, or a function of no argument returning the default session root.
The adapter of the agent whose sessions are stored sets it, when it
loads: the core does not know where that agent keeps its sessions.")

(defun magent-store--root ()
  "Return the session root in use, as an absolute directory name."
  (expand-file-name
   (or magent-store-root
       (and magent-store--default-root-function
            (funcall magent-store--default-root-function))
       (locate-user-emacs-file "magent/sessions"))))

(defcustom magent-store-flush-interval 0.25
  "Seconds between a flush request and the flush it causes.
Requests made while a flush is scheduled join it without postponing it.
While chunks stream, the first chunk after that time sends it; if they
stop while an earlier flush awaits its reply (at most a second), that
reply sends it, else a timer does."
  :type 'number
  :group 'magent-store)

(defcustom magent-store-fsync 'always
  "When the backend makes a flush durable with fsync.
`always': at every flush (what interactive magent does); `interval': at
most once per second, so a power loss may lose the last second; `never':
leave it to the operating system (a crash of the machine may lose data,
a crash of Emacs or the backend does not)."
  :type '(choice (const always) (const interval) (const never))
  :group 'magent-store)

(defcustom magent-store-log-max-events 2000
  "Events a session's log may hold before the backend compacts it."
  :type 'natnum
  :group 'magent-store)

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

;;;; State

(cl-defstruct (magent-store--backend (:constructor magent-store--backend-make)
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

(defun magent-store--new-producer ()
  "Return a fresh writer name, unique to this Emacs: its pid and randomness."
  (format "%x-%x-%x" (emacs-pid) (random most-positive-fixnum)
          (truncate (float-time))))

(cl-defstruct (magent-store--session (:constructor magent-store--session-make)
                                     (:copier nil))
  "What Emacs holds for one open session.
BATCH is a vector whose first FILL slots hold the entries not yet sent,
oldest first, `magent-store--entry-slots' slots each (see
`magent-store--enqueue'); INFLIGHT the batches sent but not yet
acknowledged, oldest first, as (NUMBER BATCH FILL): batches are
numbered per PRODUCER (this session object), so that the backend
applies a batch sent again only if its log does not hold it yet.
HELD the batches acknowledged whose text redaction still holds back
in the backend's memory (the reply's released number is below them):
kept, oldest first, until a reply releases them, and sent again first
should the backend stop.  NUMBER is the last number given.  OPENING is non-nil while the backend
opens the session, RETRY the timer that sends refused batches again,
REFUSAL what the backend last said when it refused one.
WRITTEN-SEQ is the last seq the backend wrote to the log file (it
survives a crash of the backend); DURABLE-SEQ the last one fsync covers.
DEADLINE is when the scheduled flush is due (a float), nil when none is;
TIMER the timer that sends it if no chunk or reply does first.
INITIAL is nil or the JSON text of the thread a session starts from
when the backend has no files for it (no event carries that state)."
  id scope batch (fill 0) (queued-chars 0) inflight (durable-seq 0)
  (written-seq 0) timer (flushes 0) header opened deadline initial
  (producer (magent-store--new-producer)) (number 0) opening retry refusal
  held)

(defvar magent-store--backend nil
  "The running backend, or nil.")

(defvar magent-store--sessions (make-hash-table :test #'equal)
  "Open sessions: session id -> `magent-store--session'.")

(defvar magent-store--last-error nil
  "The last error the backend or the shim reported, for the status buffer.")

(defvar magent-store--restarts nil
  "Times of automatic restarts, newest first.")

(defvar magent-store--stops nil
  "Unexpected stops of the backend in this Emacs: (COUNT TIME WHY), or nil.")

(defvar magent-store--gave-up nil
  "Non-nil once the shim told the user it could not keep the backend up.")

(defvar magent-store--recovering nil
  "When the backend last died, until every session is saved again; or nil.")



(defvar magent-store--flush-ms nil
  "Recent flush round-trip times in milliseconds, newest first.")

(defvar magent-store-persistence-enabled t
  "When nil, the append functions drop their input (for benchmarks only).")

(defvar magent-store--flush-extra-args-function nil
  "Nil, or a function returning extra arguments for the next flush message.
magent-store-timing sets it, so that its records ride the flush.")

(defvar magent-store--flushed-function nil
  "Nil, or a function called with (SENT RECORD REPLY) after each flush.
magent-store-timing sets it to record the round trip as a session save.")

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

(defun magent-store--send (method args &optional on-reply on-error printer)
  "Call METHOD with ARGS on the backend without waiting.
ON-REPLY gets the value, ON-ERROR the error message.  Signal an error
when there is no live backend.  The message is printed into a reused
buffer and sent from there: no string as large as the message is made.
PRINTER, when non-nil, is called with ARGS to print them at point
instead of `prin1' (a batch prints itself from its vector)."
  (let* ((backend (or magent-store--backend
                      (error "The magent-store backend is not running")))
         (id (cl-incf (magent-store--backend-next-id backend))))
    (when (or on-reply on-error)
      (puthash id (cons on-reply on-error)
               (magent-store--backend-replies backend)))
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
      (process-send-region (magent-store--backend-connection backend)
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
         (replies (and backend (magent-store--backend-replies backend)))
         (handlers (and replies (gethash id replies))))
    (when handlers (remhash id replies))
    (when (and backend (magent-store--backend-unresponsive backend))
      (magent-store--answering backend))
    (pcase kind
      ('return (when (car handlers) (funcall (car handlers) (nth 2 message))))
      ((or 'return-error 'epc-error)
       (let ((text (format "%s" (nth 2 message))))
         (setq magent-store--last-error text)
         (if (cdr handlers)
             (funcall (cdr handlers) text)
           (message "magent-store: %s" text)))))))

(defun magent-store--call (method args)
  "Call METHOD with ARGS and wait for the value; signal on error.
No timers run while it waits: nothing re-enters the shim.  A backend
that does not answer in time is taken to be hung (see
`magent-store--unanswered')."
  (let* ((done nil) value failure
         (backend (magent-store--ready-backend))
         (process (magent-store--backend-connection backend))
         (deadline (+ (float-time) magent-store-call-timeout)))
    (magent-store--check-answering backend method)
    (magent-store--send method args
                        (lambda (v) (setq value v done t))
                        (lambda (e) (setq failure e done t)))
    (while (and (not done) (process-live-p process)
                (< (float-time) deadline))
      ;; JUST-THIS-ONE an integer: no timers, no other process's output.
      (accept-process-output process 0.05 nil 1))
    (cond (failure (magent-store--error "%s: %s" method failure))
          (done value)
          ((not (process-live-p process))
           (magent-store--error "The backend died during %s" method))
          (t (magent-store--error "%s: %s" method
                                  (magent-store--unanswered backend))))))

;;;; A backend that does not answer

;; A backend can hang (stopped, or stuck on a disk) without dying.  The
;; first call that waits for it in vain costs `magent-store-call-timeout';
;; after that, waiting calls fail at once and nothing more is sent (a
;; socket full of batches would block Emacs), until a reply shows that
;; it answers again.  Entries queue in Emacs meanwhile, as always.

(defun magent-store--restart-hint ()
  "Return how to restart the backend, for a message."
  (substitute-command-keys "\\[magent-store-restart] restarts it"))

(defun magent-store--unanswered (backend)
  "Mark BACKEND as not answering; return what to tell the user."
  (unless (magent-store--backend-unresponsive backend)
    (setf (magent-store--backend-unresponsive backend) (float-time)))
  (setq magent-store--last-error
        (format "the backend (pid %s) did not answer within %ss; until it \
does, nothing more is sent to it and unsaved entries stay in Emacs (%s)"
                (magent-store--backend-pid backend) magent-store-call-timeout
                (magent-store--restart-hint))))

(defun magent-store--check-answering (backend what)
  "Signal at once, naming WHAT, when BACKEND is known not to answer."
  (when-let ((since (magent-store--backend-unresponsive backend)))
    (magent-store--error
     "%s: the backend (pid %s) is not answering (for %.0fs); unsaved \
entries stay in Emacs; %s"
     what (magent-store--backend-pid backend) (- (float-time) since)
     (magent-store--restart-hint))))

(defun magent-store--answering (backend)
  "BACKEND, taken to be hung, answered: send what queued meanwhile.
A header put meanwhile goes first (the backend writes it only if it
changed); a session waiting for a retry sends at its retry."
  (setf (magent-store--backend-unresponsive backend) nil)
  (message "magent-store: the backend answers again; what Emacs kept \
meanwhile is being saved")
  (maphash (lambda (id session)
             (when (magent-store--sendable-p session)
               (when-let ((header (magent-store--session-header session)))
                 (magent-store--send "put-header" (list id header) nil #'ignore))
               (when (and (not (magent-store--session-inflight session))
                          (> (magent-store--session-fill session) 0))
                 (magent-store--flush-now session t))))
           magent-store--sessions))

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

(defun magent-store--kill-emacs ()
  "Flush everything before Emacs exits."
  (when magent-store--backend
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
         (backend (magent-store--backend-make :started-at (float-time)
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
    (setf (magent-store--backend-process backend) server)
    (setq magent-store--backend backend)
    (add-hook 'kill-emacs-hook #'magent-store--kill-emacs)
    backend))

(defun magent-store--server-output (backend process output)
  "Read BACKEND's port from PROCESS's OUTPUT, then connect and authenticate."
  (unless (magent-store--backend-connection backend)
    (setf (magent-store--backend-output backend)
          (concat (magent-store--backend-output backend) output))
    (let ((text (magent-store--backend-output backend)))
      (if (string-match "^\\([0-9]+\\)\n" text)
          (condition-case err
              (magent-store--connect backend
                                     (string-to-number (match-string 1 text)))
            (error
             (setf (magent-store--backend-failure backend)
                   (format "cannot connect to the backend: %s"
                           (error-message-string err)))
             (delete-process process)))
        (when (> (length text) 4096)
          ;; Not a port: say what it printed (a traceback, say) and stop.
          (setf (magent-store--backend-failure backend)
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
    (setf (magent-store--backend-connection backend) connection
          (magent-store--backend-port backend) port)
    (magent-store--send
     "auth" (list (magent-store--backend-token backend))
     (lambda (reply)
       (setf (magent-store--backend-spool backend) (nth 0 reply)
             (magent-store--backend-pid backend) (nth 1 reply)
             (magent-store--backend-token backend) nil
             (magent-store--backend-ready backend) t)
       (magent-store--check-version (nth 2 reply)
                                    (magent-store--backend-program backend))
       (magent-store--backend-ready-hook backend))
     (lambda (why)
       (setf (magent-store--backend-failure backend)
             (format "the backend refused the token: %s" why))
       (delete-process connection)))))

(defun magent-store--backend-ready-hook (backend)
  "BACKEND took our token: open every session it does not hold yet."
  (when (eq backend magent-store--backend)
    (maphash (lambda (_id session)
               (unless (or (magent-store--session-opened session)
                           (magent-store--session-opening session))
                 (magent-store--reopen session)))
             magent-store--sessions)))

(defun magent-store--ready-p (backend)
  "Non-nil when BACKEND is authenticated and not stopping."
  (and backend (magent-store--backend-ready backend)
       (not (magent-store--backend-stopping backend))
       (process-live-p (magent-store--backend-connection backend))))

(defun magent-store--wait-ready (backend)
  "Wait until BACKEND is ready, running no timers; signal if it cannot be."
  (let ((deadline (+ (float-time) magent-store-call-timeout)))
    (while (and (not (magent-store--backend-ready backend))
                (not (magent-store--backend-stopping backend))
                (< (float-time) deadline))
      (let ((connection (magent-store--backend-connection backend)))
        ;; JUST-THIS-ONE an integer: no timers run, nothing re-enters us.
        (accept-process-output (if (process-live-p connection)
                                   connection
                                 (magent-store--backend-process backend))
                               0.05 nil 1)))
    (unless (magent-store--ready-p backend)
      (magent-store--error
       "The backend did not start: %s (see `magent-store-python' and %s)"
       (or (magent-store--backend-failure backend)
           (if (magent-store--backend-stopping backend)
               "it exited"
             (format "no answer within %ss" magent-store-call-timeout)))
       (expand-file-name "server.log" (magent-store--log-directory))))
    backend))

(defun magent-store--check-version (version program)
  "Say so when the backend PROGRAM reports VERSION, not ours."
  (unless (equal version magent-store-version)
    (setq magent-store--last-error
          (format "the backend (%s) %s, this package is version %s: \
M-x magent-store-install-backend installs the matching backend"
                  program
                  (if version (format "is version %s" version)
                    "is too old to report its version")
                  magent-store-version))
    (display-warning 'magent-store magent-store--last-error)))

(defun magent-store--await-exit (backend)
  "Give BACKEND, asked to shut down, up to 3 s to exit by itself.
Its cleanup (closing sessions, removing its spool directory) runs
just before it exits: killed earlier, it leaves the spool behind."
  (let ((process (magent-store--backend-process backend))
        (deadline (+ (float-time) 3)))
    (while (and (process-live-p process) (< (float-time) deadline))
      ;; JUST-THIS-ONE an integer: no timers or other filters run.
      (accept-process-output process 0.05 nil 1))))

(defun magent-store--kill-backend (backend)
  "Forget BACKEND and make sure its processes are gone."
  (when backend
    (setf (magent-store--backend-stopping backend) t)
    (when (eq magent-store--backend backend)
      (setq magent-store--backend nil))
    (let ((connection (magent-store--backend-connection backend)))
      (when (processp connection)
        (delete-process connection)
        (when (buffer-live-p (process-buffer connection))
          (kill-buffer (process-buffer connection)))))
    (when (process-live-p (magent-store--backend-process backend))
      (delete-process (magent-store--backend-process backend)))))

(defun magent-store--ensure-backend ()
  "Return the backend, starting it (without waiting) when there is none."
  (let ((backend magent-store--backend))
    (if (and backend (not (magent-store--backend-stopping backend)))
        backend
      (magent-store--start-backend))))

(defun magent-store--ready-backend ()
  "Return the backend once it is ready, starting it and waiting if needed."
  (magent-store--wait-ready (magent-store--ensure-backend)))

(defun magent-store--sentinel (process _event)
  "Notice that PROCESS, part of the backend, went away."
  (let ((backend magent-store--backend))
    (when (and backend
               (not (magent-store--backend-stopping backend))
               (memq process (list (magent-store--backend-connection backend)
                                   (magent-store--backend-process backend)))
               (not (process-live-p process)))
      (setf (magent-store--backend-stopping backend) t)
      ;; Outside the sentinel, which may run inside a send of ours.
      (run-at-time 0 nil #'magent-store--recover backend))))

(defcustom magent-store-restart-limit 3
  "Automatic restarts of the backend allowed within a minute.
Past that the shim stops restarting it and says so; unsaved changes
stay in Emacs until \\[magent-store-restart]."
  :type 'natnum
  :group 'magent-store)

(defcustom magent-store-retry-interval 5
  "Seconds between attempts to send again a batch the backend refused.
A refused batch (a full disk, say) stays in Emacs until it is saved."
  :type 'number
  :group 'magent-store)

(defun magent-store--recover (backend)
  "Start a new backend after BACKEND died; reopen and resend asynchronously.
Every timer of every session is cancelled first: nothing is sent until
the new backend has reopened the session and taken what it had not
saved, in order; chunks keep queueing meanwhile."
  (magent-store--note-stop backend)
  (magent-store--kill-backend backend)
  (maphash (lambda (_id session) (magent-store--session-detach session))
           magent-store--sessions)
  (let ((recent (cl-remove-if (lambda (time) (< time (- (float-time) 60)))
                              magent-store--restarts)))
    (setq magent-store--restarts recent)
    (if (or magent-store--gave-up
            (>= (length recent) magent-store-restart-limit))
        (magent-store--give-up
         (format "the backend stopped %d times within a minute"
                 (1+ (length recent))))
      (push (float-time) magent-store--restarts)
      (setq magent-store--recovering (float-time))
      (condition-case err
          (magent-store--start-backend)
        (error (magent-store--give-up (error-message-string err)))))))

(defun magent-store--note-stop (backend)
  "Count that BACKEND stopped unexpectedly, with why, for the status buffer."
  (let ((process (magent-store--backend-process backend)))
    (when (process-live-p process)
      ;; The connection closes first; the exit follows within moments.
      (accept-process-output process 0.2 nil 1))
    (setq magent-store--stops
          (list (1+ (or (car magent-store--stops) 0))
                (float-time)
                (pcase (and (processp process) (process-status process))
                  ('signal (format "was killed by signal %d"
                                   (process-exit-status process)))
                  ('exit (format "exited with status %d"
                                 (process-exit-status process)))
                  (_ "closed its connection"))))))

(defun magent-store--session-detach (session)
  "Forget that SESSION is open on a backend; cancel its timers."
  (dolist (timer (list (magent-store--session-timer session)
                       (magent-store--session-retry session)))
    (when timer (cancel-timer timer)))
  (setf (magent-store--session-timer session) nil
        (magent-store--session-retry session) nil
        (magent-store--session-opened session) nil
        (magent-store--session-opening session) nil))

(defun magent-store--maybe-recovered ()
  "Say so once every session has everything saved after a restart."
  (when (and magent-store--recovering
             (magent-store--ready-p magent-store--backend)
             (catch 'pending
               (maphash (lambda (_id session)
                          (when (or (not (magent-store--session-opened session))
                                    (magent-store--session-inflight session))
                            (throw 'pending nil)))
                        magent-store--sessions)
               t))
    (setq magent-store--recovering nil)
    (message "magent-store: the backend stopped and was restarted; \
everything it had not saved was sent again and is saved")))

(defun magent-store--give-up (why)
  "Tell the user once that persistence stopped, because of WHY."
  (setq magent-store--last-error why
        magent-store--recovering nil)
  (unless magent-store--gave-up
    (setq magent-store--gave-up t)
    (message "%s" (substitute-command-keys
                   (format "magent-store: %s; unsaved changes are kept in \
Emacs, \\[magent-store-restart] retries (backend log in %s)"
                           why (magent-store--log-directory))))))

(defun magent-store--log-directory ()
  "Return where the backend logs."
  (expand-file-name "magent-store"
                    (or (getenv "XDG_STATE_HOME") "~/.local/state")))

(defun magent-store--reopen (session)
  "Open SESSION on the backend, then send again what it has not saved.
Each unacknowledged batch goes again under its own number: the backend
skips the ones already in its log.  Then the queue follows."
  (setf (magent-store--session-opening session) t)
  (magent-store--send
   "open" (magent-store--open-args session)
   (lambda (last-seq)
     (setf (magent-store--session-opening session) nil
           (magent-store--session-opened session) t)
     (unless (magent-store--session-inflight session)
       (setf (magent-store--session-durable-seq session) last-seq
             (magent-store--session-written-seq session) last-seq))
     (when-let ((header (magent-store--session-header session)))
       (magent-store--send "put-header"
                           (list (magent-store--session-id session) header)
                           nil (magent-store--header-refused
                                (magent-store--session-id session))))
     (magent-store--resend session))
   (lambda (why)
     (setf (magent-store--session-opening session) nil)
     (magent-store--refused session why))))

(defun magent-store--resend (session)
  "Send SESSION's unacknowledged batches again, in order, then its queue.
The held batches go first (a new backend has none of their held text),
then those in flight, then the queue, all as ticks: a tick leaves the
text redaction holds back held, so a secret split across them is still
caught.
Called by the retry timer, and by the reply to the session's opening
inside the process filter: sent later, a chunk's flush could overtake
them, and batches never overtake each other.  Only after a restart or
a refusal do batches go again."
  (when-let ((held (magent-store--session-held session)))
    (setf (magent-store--session-inflight session)
          (sort (append held (magent-store--session-inflight session))
                (lambda (a b) (< (car a) (car b))))
          (magent-store--session-held session) nil))
  (dolist (record (magent-store--session-inflight session))
    (magent-store--send-batch session record t))
  (if (> (magent-store--session-fill session) 0)
      (magent-store--flush-now session t)
    (magent-store--maybe-recovered)))

(defun magent-store--refused (session why)
  "The backend refused a batch or the opening of SESSION because of WHY.
Nothing is dropped: everything stays in Emacs and is sent again after
`magent-store-retry-interval' seconds, until the backend has it."
  (unless (string-match-p "came before batch" why)
    ;; That one only follows another refusal: the first says why.
    (setq magent-store--last-error why))
  (unless (or (string-match-p "came before batch" why)
              ;; The same refusal with other numbers (bytes needed) is news
              ;; to nobody: say it once.
              (equal (magent-store--refusal-kind why)
                     (magent-store--refusal-kind
                      (magent-store--session-refusal session))))
    (setf (magent-store--session-refusal session) why)
    (message "magent-store: session %s is not saved: %s; its %d unsaved \
entries stay in Emacs and are sent again every %ss"
             (magent-store--session-id session) why
             (magent-store--unsaved session) magent-store-retry-interval))
  (when (string-match-p "is not open here" why)
    (setf (magent-store--session-opened session) nil))
  (unless (magent-store--session-retry session)
    (setf (magent-store--session-retry session)
          (run-at-time magent-store-retry-interval nil
                       #'magent-store--retry session))))

(defun magent-store--refusal-kind (why)
  "Return WHY, a refusal's text, without its numbers, or nil."
  (and why (replace-regexp-in-string "[0-9]+" "N" why t t)))

(defun magent-store--retry (session)
  "Send SESSION's unsaved entries again, reopening it first if needed."
  (setf (magent-store--session-retry session) nil)
  (let ((backend magent-store--backend))
    (when (and (magent-store--ready-p backend)
               (eq session (gethash (magent-store--session-id session)
                                    magent-store--sessions)))
      (cond ((magent-store--backend-unresponsive backend)
             ;; Nothing is sent to a backend that does not answer: later.
             (setf (magent-store--session-retry session)
                   (run-at-time magent-store-retry-interval nil
                                #'magent-store--retry session)))
            ((magent-store--session-opening session))
            ((not (magent-store--session-opened session))
             (magent-store--reopen session))
            (t (magent-store--resend session))))))

;;;; Sessions and batches

(defun magent-store-scope-directory (scope &optional root)
  "Return the directory holding the sessions of SCOPE under ROOT.
SCOPE is `global' (or nil), a project root, or (action . NAME), as
magent names it: `global/', `projects/' and the SHA-1 of the project
root, or `actions/' and the action's name with each run of characters
outside [[:alnum:]_.-] made one `-'.  ROOT defaults to the session root
magent-store uses.  With SCOPE `*', return every directory of ROOT that
holds sessions (a list), global's first."
  (let ((root (file-name-as-directory (or root (magent-store--root)))))
    (pcase scope
      ('* (cl-loop for pattern in '("global" "projects/*" "actions/*")
                   append (cl-remove-if-not
                           #'file-directory-p
                           (file-expand-wildcards (expand-file-name pattern root)))))
      ((or 'nil 'global "global") (expand-file-name "global" root))
      (`(action . ,name)
       (expand-file-name
        (concat "actions/" (replace-regexp-in-string
                            "[^[:alnum:]_.-]+" "-" (string-trim (format "%s" name))))
        root))
      ((pred stringp)
       (expand-file-name (concat "projects/" (secure-hash 'sha1 (expand-file-name scope)))
                         root))
      (_ (user-error "Invalid magent-store scope: %S" scope)))))

(defun magent-store--scope-json (scope)
  "Return SCOPE (`global', a project root, or (action . NAME)) as JSON text."
  (magent-store-json-encode
   (pcase scope
     ((or 'nil 'global "global") "global")
     ((pred stringp) (expand-file-name (magent-store-json-text scope)))
     (`(action . ,name) `((action . ,(format "%s" name))))
     (_ (user-error "Invalid magent-store scope: %S" scope)))))

(defun magent-store--options-json ()
  "Return the store options as JSON text.
With `magent-store-redact' on, they hold the redaction spec, secrets
included: the options are never logged."
  (let ((options (magent-store-json-encode
                  `((fsync . ,(symbol-name magent-store-fsync))
                    (log-max-events . ,magent-store-log-max-events))))
        (spec (magent-store-redact-spec-json)))
    (if spec
        (concat (substring options 0 -1) ",\"redact\":" spec "}")
      options)))

(defun magent-store--open-args (session)
  "Return the arguments of the open call for SESSION."
  (let ((args (list (magent-store-json-text (magent-store--root))
                    (magent-store--scope-json
                     (magent-store--session-scope session))
                    (magent-store--session-id session)
                    (magent-store--options-json))))
    (if-let ((initial (magent-store--session-initial session)))
        (append args (list initial))
      args)))

(defvar magent-store--recent nil
  "(SESSION-ID . SESSION) of the last lookup: streaming asks for one id.
Cleared whenever a session is forgotten.")

(defsubst magent-store--get (session-id)
  "Return the open session SESSION-ID or signal a `user-error'."
  (let ((recent magent-store--recent))
    (if (and recent (eq session-id (car recent)))
        (cdr recent)
      (let ((session
             (or (gethash session-id magent-store--sessions)
                 (user-error "Session %s is not open in magent-store"
                             session-id))))
        (setq magent-store--recent (cons session-id session))
        session))))

(defun magent-store--ensure-session (session-id scope &optional initial)
  "Return session SESSION-ID under SCOPE, opening it (without waiting) if needed.
INITIAL, JSON text of a thread snapshot, is the state the backend starts
the session from when it has no files for it."
  (or (gethash session-id magent-store--sessions)
      (let ((session (magent-store--session-make :id session-id :scope scope
                                                 :initial initial)))
        (puthash session-id session magent-store--sessions)
        (condition-case err
            (let ((backend (magent-store--ensure-backend)))
              ;; A backend still starting opens it once it is ready.
              (when (magent-store--ready-p backend)
                (magent-store--reopen session)))
          (error (magent-store--give-up (error-message-string err))))
        session)))

(defsubst magent-store--due (session now)
  "Schedule SESSION's flush, or send it now (NOW, a float) if its time has come.
While chunks stream, the flush goes out with the first one after its
deadline: that chunk already woke Emacs up, a timer would wake it
again.  See `magent-store--schedule' for what catches a stream that
stopped."
  (let ((deadline (magent-store--session-deadline session)))
    (cond ((not deadline) (magent-store--schedule session now))
          ((>= now deadline) (magent-store--tick session)))))

;;;; Batches: entries in a reused vector

;; Streaming appends a chunk many times a second, and whatever it
;; allocates becomes garbage collections in the user's Emacs.  So a
;; session's unsent entries live in a vector, four slots each, that is
;; reused once the backend acknowledged it: appending a chunk stores
;; references and allocates nothing.  A chunk's time is the float the
;; caller already has (magent's own, through the mode), at full precision.

(defconst magent-store--entry-slots 4
  "Slots an entry takes in a batch vector.
A chunk is ITEM-ID CHUNK OUTPUT-P TIME (TIME in seconds, a float); an
event is its JSON TEXT, then nil in the other three.")

(defconst magent-store--batch-pool-max 8
  "Acknowledged batch vectors kept for reuse.")

(defvar magent-store--batch-pool nil
  "Cleared batch vectors, ready for reuse.")

(defun magent-store--grow (session)
  "Give SESSION a batch vector with room for more entries; return it."
  (let* ((old (magent-store--session-batch session))
         (batch (cond (old (vconcat old (make-vector (length old) nil)))
                      ((pop magent-store--batch-pool))
                      (t (make-vector 256 nil)))))
    (setf (magent-store--session-batch session) batch)))

(defsubst magent-store--enqueue (session a b c d)
  "Append the entry A B C D to SESSION's batch."
  (let ((batch (magent-store--session-batch session))
        (fill (magent-store--session-fill session)))
    (when (> (+ fill magent-store--entry-slots) (length batch))
      (setq batch (magent-store--grow session)))
    (aset batch fill a)
    (aset batch (+ fill 1) b)
    (aset batch (+ fill 2) c)
    (aset batch (+ fill 3) d)
    (setf (magent-store--session-fill session)
          (+ fill magent-store--entry-slots))))

(defun magent-store--recycle (batch)
  "Clear BATCH, a vector the backend has acknowledged, and keep it for reuse."
  (when (and batch (<= (length batch) 4096)
             (< (length magent-store--batch-pool) magent-store--batch-pool-max))
    (fillarray batch nil)
    (push batch magent-store--batch-pool)))

(defun magent-store--unsaved (session)
  "Return the number of entries of SESSION the backend has not saved."
  (/ (+ (magent-store--session-fill session)
        (apply #'+ (mapcar (lambda (record) (nth 2 record))
                           (append (magent-store--session-held session)
                                   (magent-store--session-inflight session)))))
     magent-store--entry-slots))

(defsubst magent-store--push (session text size)
  "Queue the event TEXT of SIZE characters for SESSION; schedule a flush."
  (magent-store--enqueue session text nil nil nil)
  (cl-incf (magent-store--session-queued-chars session) size)
  (magent-store--due session (float-time)))

(defsubst magent-store--push-chunk (session item-id chunk output-p time)
  "Queue CHUNK appended to ITEM-ID (its output if OUTPUT-P) at TIME.
TIME is a float, seconds since the epoch.  Schedule SESSION's flush."
  (magent-store--enqueue session item-id chunk (and output-p t) time)
  (cl-incf (magent-store--session-queued-chars session) (length chunk))
  (magent-store--due session time))

(defun magent-store--print-batch (batch fill)
  "Print the entries of BATCH's first FILL slots at point, as one list.
Bytes in strings are turned into text as by `magent-store-print'."
  ;; t: print strings as they are; the default copies each one first.
  (let ((print-charset-text-property t)
        (print-escape-newlines nil)
        (print-escape-nonascii nil)
        (print-escape-multibyte nil)
        (print-escape-control-characters nil)
        (buffer (current-buffer))
        (start (point))
        (i 0))
    (insert "(")
    (while (< i fill)
      (let ((chunk (aref batch (1+ i))))
        (if (not chunk)
            (magent-store-print--string (aref batch i))
          (insert "(")
          (magent-store-print--string (aref batch i))
          (insert " ")
          (magent-store-print--string chunk)
          (insert (if (aref batch (+ i 2)) " t " " nil "))
          (prin1 (aref batch (+ i 3)) buffer)
          (insert ")")))
      (insert " ")
      (setq i (+ i magent-store--entry-slots)))
    (insert ")")
    (magent-store-print--unescape-bytes start)))

(defun magent-store--print-flush-args (args)
  "Print ARGS, (SESSION-ID RECORD . EXTRA), as a flush's arguments at point."
  (let ((buffer (current-buffer))
        (record (nth 1 args)))
    (insert "(")
    (prin1 (car args) buffer)
    (insert " ")
    (magent-store--print-batch (nth 1 record) (nth 2 record))
    (dolist (arg (nthcdr 2 args))
      (insert " ")
      (magent-store-print arg))
    (insert ")")))

(defun magent-store--schedule (session now)
  "Schedule SESSION's flush one interval after NOW.
A chunk after the deadline sends it.  Should the stream stop, a timer
sends it, a little after the deadline; but while a batch of SESSION
awaits its reply, that reply comes within a second (the backend holds
a tick's reply at most that long) and sends what queued meanwhile
\(`magent-store--after-reply'): no timer is pending while chunks
stream.  A pending timer is not free: Emacs copies and decodes every
pending timer each time it wakes up, on every chunk of a stream."
  (setf (magent-store--session-deadline session)
        (+ now magent-store-flush-interval))
  (unless (or (magent-store--session-timer session)
              (magent-store--session-inflight session))
    (setf (magent-store--session-timer session)
          (run-at-time (* 1.4 magent-store-flush-interval) nil
                       #'magent-store--tick session))))

(defun magent-store--after-reply (session)
  "Have what SESSION queued while its last batch awaited this reply sent.
Called when a batch of SESSION is answered, inside the connection's
process filter: the batch is printed and sent by a timer due at once,
which runs when the filter has returned (timers run before Emacs waits
again, so it costs no wakeup of its own), not by the filter, which then
only reads replies.  The timer is the session's flush timer: a chunk or
a flush that sends first cancels it.  While another batch awaits its
reply, that reply will come and call this again."
  (when (and (null (magent-store--session-inflight session))
             (magent-store--session-deadline session)
             (not (magent-store--session-timer session)))
    (setf (magent-store--session-timer session)
          (run-at-time 0 nil #'magent-store--tick session))))

(defun magent-store--tick (session)
  "Send SESSION's queued entries: the flush timer's function.
The backend may hold the reply back and send it with later ones
\(the batch is already on disk; every reply wakes Emacs up)."
  (when-let ((timer (magent-store--session-timer session)))
    (cancel-timer timer)
    (setf (magent-store--session-timer session) nil))
  (setf (magent-store--session-deadline session) nil)
  (magent-store--flush-now session t))

(defun magent-store--sendable-p (session)
  "Non-nil when a batch of SESSION may go to the backend now.
Not while the backend starts, the session is being reopened, or a
refused batch waits for its retry: batches never overtake each other."
  (and (magent-store--ready-p magent-store--backend)
       (not (magent-store--backend-unresponsive magent-store--backend))
       (magent-store--session-opened session)
       (not (magent-store--session-retry session))))

(defun magent-store--flush-now (session &optional tick)
  "Send SESSION's queue as one batch, to be applied and flushed.
Chunks travel as (ITEM-ID CHUNK OUTPUT-P TIME) lists and events as their
JSON text, printed straight from the batch vector into the message: no
per-chunk JSON, no list built.  With TICK, send it as a tick, whose
reply the backend may hold back.  The batch gets the session's next
number and stays in INFLIGHT until the backend says it is in the log;
an empty batch still flushes (the header, say).  While the session
cannot send, its entries stay queued."
  (when (magent-store--sendable-p session)
    (let* ((fill (magent-store--session-fill session))
           (batch (and (> fill 0) (magent-store--session-batch session)))
           (large (> (magent-store--session-queued-chars session)
                     magent-store-file-threshold))
           (record (list (cl-incf (magent-store--session-number session))
                         batch fill large)))
      (when batch
        (setf (magent-store--session-batch session)
              (pop magent-store--batch-pool)))
      (setf (magent-store--session-fill session) 0
            (magent-store--session-queued-chars session) 0)
      (setf (magent-store--session-inflight session)
            (nconc (magent-store--session-inflight session) (list record)))
      (cl-incf (magent-store--session-flushes session))
      (magent-store--send-batch
       session record tick
       (and magent-store--flush-extra-args-function
            (funcall magent-store--flush-extra-args-function))))))

(defun magent-store--send-batch (session record tick &optional extra)
  "Send the batch RECORD, (NUMBER BATCH FILL LARGE), of SESSION.
With TICK as a tick; EXTRA is the list of extra arguments (timing
records).  A LARGE batch travels as a file, or in the message when
the file cannot be written (a full disk) or redaction is on (the file
would be an unredacted copy on disk)."
  (let* ((backend magent-store--backend)
         (id (magent-store--session-id session))
         (ident (list (magent-store--session-producer session) (car record)))
         (sent (float-time))
         (file (and (nth 3 record)
                    (not magent-store-redact)
                    (ignore-errors
                      (magent-store--spool-file backend (nth 1 record)
                                                (nth 2 record))))))
    (condition-case nil
        (if file
            (magent-store--send (if tick "tick-file" "flush-file")
                                (list id file (car extra) ident)
                                (magent-store--on-flushed session record sent)
                                (magent-store--on-refused session record))
          (magent-store--send (if tick "tick" "flush")
                              (list id record (car extra) ident)
                              (magent-store--on-flushed session record sent)
                              (magent-store--on-refused session record)
                              #'magent-store--print-flush-args))
      ;; The connection is gone: the sentinel restarts and resends.
      (error nil))))

(defun magent-store--spool-file (backend batch fill)
  "Write BATCH's first FILL slots to a new private file in BACKEND's spool.
Return the file's name; signal (and leave no file) if it cannot be written."
  (let ((file (make-temp-file
               (expand-file-name "batch-" (magent-store--backend-spool backend))))
        (coding-system-for-write 'utf-8-unix))
    (magent-store--with-send-buffer
      (magent-store--print-batch batch fill)
      (condition-case err
          (with-file-modes #o600
            (write-region (point-min) (point-max) file nil 'silent))
        (error (ignore-errors (delete-file file))
               (signal (car err) (cdr err)))))
    file))

(defun magent-store--on-flushed (session record sent)
  "Return the reply handler of the batch RECORD of SESSION sent at SENT."
  (lambda (reply)
    ;; A batch sent again may be answered twice: the first answer counts.
    (when (memq record (magent-store--session-inflight session))
      (setf (magent-store--session-inflight session)
            (delq record (magent-store--session-inflight session))
            (magent-store--session-durable-seq session) (nth 0 reply)
            (magent-store--session-written-seq session) (nth 1 reply))
      (magent-store--release session record (or (nth 5 reply) (car record)))
      (push (* 1000 (- (float-time) sent)) magent-store--flush-ms)
      (when (nthcdr 256 magent-store--flush-ms)
        (setcdr (nthcdr 127 magent-store--flush-ms) nil))
      (when magent-store--flushed-function
        (funcall magent-store--flushed-function sent record reply))
      (dolist (notice (nth 6 reply))
        (message "magent-store: %s" notice))
      (when-let ((rejected (nth 4 reply)))
        (setq magent-store--last-error (car rejected))
        (message "magent-store: session %s: %d entries rejected (%s)"
                 (magent-store--session-id session) (length rejected)
                 (car rejected)))
      (unless (magent-store--session-inflight session)
        (when (magent-store--session-refusal session)
          (setf (magent-store--session-refusal session) nil)
          (message "magent-store: session %s is saved again; nothing was lost"
                   (magent-store--session-id session)))
        (magent-store--maybe-recovered))
      (magent-store--after-reply session))))

(defun magent-store--release (session record released)
  "Forget SESSION's batches up to number RELEASED; keep RECORD if it is after.
RECORD was just acknowledged; the backend still holds back some text of
the batches after RELEASED (redaction waits for the end of a word), and
sends them again, should it stop, only if Emacs still has them."
  (let ((held (magent-store--session-held session)))
    (when (> (car record) released)
      (setq held (nconc held (list record))))
    (while (and held (<= (car (car held)) released))
      (unless (eq (car held) record)
        (magent-store--recycle (nth 1 (car held))))
      (setq held (cdr held)))
    (when (<= (car record) released)
      (magent-store--recycle (nth 1 record)))
    (setf (magent-store--session-held session) held)))

(defun magent-store--on-refused (session record)
  "Return the error handler of the batch RECORD of SESSION."
  (lambda (why)
    ;; The backend has none of it: keep it and send it again.
    (when (memq record (magent-store--session-inflight session))
      (magent-store--refused session why))))

(defun magent-store--scope-arg (scope)
  "Return SCOPE normalized for `magent-store--session-make'."
  (if (or (null scope) (equal scope "global")) 'global scope))

;;;; Public functions

(defun magent-store-open (session-id &optional scope)
  "Open session SESSION-ID under SCOPE in the backend and wait for it.
SCOPE is `global' (the default), a project root directory, or
\(action . NAME).  Return the session's last event seq on disk."
  (let ((session (or (gethash session-id magent-store--sessions)
                     (magent-store--session-make
                      :id session-id :scope (magent-store--scope-arg scope)))))
    (magent-store--ready-backend)
    (unless (magent-store--session-opened session)
      (let ((last-seq (magent-store--call "open"
                                          (magent-store--open-args session))))
        (setf (magent-store--session-opened session) t
              (magent-store--session-durable-seq session) last-seq
              (magent-store--session-written-seq session) last-seq)
        (puthash session-id session magent-store--sessions)))
    (magent-store--session-durable-seq session)))

(defun magent-store-append-event (session-id event)
  "Queue EVENT, a journal event in magent's shape, for SESSION-ID.
EVENT is an alist, or its JSON text (unibyte or multibyte, from
`json-serialize' or `json-encode').  The session must be open.
Nothing waits for the backend."
  (when magent-store-persistence-enabled
    (let ((text (magent-store-json-arg event)))
      (magent-store--push (magent-store--get session-id) text (length text)))))

(defun magent-store-append-item-content (session-id item-id chunk
                                                    &optional output-p)
  "Queue CHUNK appended to ITEM-ID's content in SESSION-ID.
With OUTPUT-P, CHUNK is appended to the item's output.  This is the
streaming hot path: it takes the time (one float) and allocates nothing
else."
  (when (and magent-store-persistence-enabled (stringp chunk)
             (> (length chunk) 0))
    (magent-store--push-chunk (magent-store--get session-id)
                              item-id chunk output-p (float-time))))

(defun magent-store-put-header (session-id header)
  "Queue HEADER as the header of SESSION-ID, sent before its next flush.
HEADER is an alist or its JSON text, as for `magent-store-append-event'."
  (let ((session (magent-store--get session-id))
        (text (magent-store-json-arg header)))
    (setf (magent-store--session-header session) text)
    ;; Otherwise the session's reopening sends it.
    (when (magent-store--sendable-p session)
      (magent-store--send "put-header" (list session-id text) nil
                          (magent-store--header-refused session-id)))))

(defun magent-store--header-refused (session-id)
  "Return a handler of a refusal of SESSION-ID's header: a message and the error."
  (lambda (why)
    (setq magent-store--last-error
          (format "header of %s refused: %s" session-id why))
    (message "magent-store: header of %s refused: %s" session-id why)))

(defun magent-store-request-flush (session-id)
  "Ask for SESSION-ID to be flushed within `magent-store-flush-interval'.
The first request schedules the flush; later ones join it."
  (let* ((recent magent-store--recent)
         (session (if (and recent (eq session-id (car recent)))
                      (cdr recent)
                    (gethash session-id magent-store--sessions))))
    (when (and session (not (magent-store--session-deadline session)))
      (magent-store--schedule session (float-time)))))

(defun magent-store-flush (session-id)
  "Flush SESSION-ID now and return its durable seq once the backend has it.
Signal an error naming why when the backend cannot save it yet (its
entries stay in Emacs and are sent again)."
  (let* ((session (magent-store--get session-id))
         (backend (magent-store--ready-backend))
         (process (magent-store--backend-connection backend))
         (deadline (+ (float-time) magent-store-call-timeout)))
    (magent-store--check-answering backend (format "Flush of %s" session-id))
    (when-let ((timer (magent-store--session-timer session)))
      (cancel-timer timer)
      (setf (magent-store--session-timer session) nil))
    (setf (magent-store--session-deadline session) nil)
    (unless (or (magent-store--session-opened session)
                (magent-store--session-opening session))
      (magent-store--reopen session))
    (magent-store--flush-now session)
    (let ((last (car (last (magent-store--session-inflight session)))))
      (while (and (or (magent-store--session-inflight session)
                      (> (magent-store--session-fill session) 0)
                      (magent-store--session-held session)
                      (not (magent-store--session-opened session)))
                  (not (magent-store--session-retry session))
                  (magent-store--ready-p backend)
                  (< (float-time) deadline))
        ;; JUST-THIS-ONE an integer: no timers run while we wait.
        (accept-process-output process 0.05 nil 1)
        ;; The session may just have been opened or reopened, its queue
        ;; and its batches sent as ticks, whose replies the backend holds
        ;; back up to a second: a flush sent after them has it answer them
        ;; at once, and write what redaction holds back.
        (when (and (magent-store--sendable-p session)
                   (or (> (magent-store--session-fill session) 0)
                       (if (magent-store--session-inflight session)
                           (not (eq last (car (last (magent-store--session-inflight
                                                     session)))))
                         (magent-store--session-held session))))
          (magent-store--flush-now session)
          (setq last (car (last (magent-store--session-inflight session)))))))
    (when (or (magent-store--session-inflight session)
              (> (magent-store--session-fill session) 0)
              (magent-store--session-held session))
      (magent-store--error
       "Flush of %s did not complete%s" session-id
       (cond ((magent-store--session-refusal session)
              (concat ": " (magent-store--session-refusal session)))
             ((not (magent-store--ready-p backend)) ": the backend stopped")
             ((>= (float-time) deadline)
              (concat ": " (magent-store--unanswered backend)))
             (t ""))))
    (magent-store--session-durable-seq session)))

(defun magent-store-load (session-id &optional scope)
  "Open SESSION-ID under SCOPE and return (:header ALIST :snapshot ALIST).
The backend writes the JSON to a private file, read here and deleted:
megabytes never cross the EPC wire."
  (magent-store--ready-backend)
  (when (gethash session-id magent-store--sessions)
    ;; What Emacs still holds must be in the snapshot it gets back.
    (magent-store-flush session-id))
  (let* ((session (or (gethash session-id magent-store--sessions)
                      (magent-store--session-make
                       :id session-id :scope (magent-store--scope-arg scope))))
         (file (magent-store--call "load" (magent-store--open-args session))))
    (setf (magent-store--session-opened session) t)
    (puthash session-id session magent-store--sessions)
    (unwind-protect
        (let ((data (with-temp-buffer
                      (let ((coding-system-for-read 'utf-8-unix))
                        (insert-file-contents file))
                      (json-parse-buffer :object-type 'alist
                                         :null-object nil
                                         :false-object magent-store-json-false))))
          (list :header (alist-get 'header data)
                :snapshot (alist-get 'snapshot data)))
      (delete-file file))))

(defun magent-store-close (session-id)
  "Flush SESSION-ID, close it in the backend and forget it."
  (when (gethash session-id magent-store--sessions)
    (when magent-store--backend
      (magent-store-flush session-id)
      (magent-store--call "close" (list session-id)))
    (setq magent-store--recent nil)
    (remhash session-id magent-store--sessions)))

(defun magent-store-close-all ()
  "Flush every session this Emacs has open, close it in the backend, forget it.
What a tool over the session files (relocate, scrub) needs first: the
backend then holds none of them.  Streaming opens again what it needs
\(magent's next event or chunk).  Never signals; return how many
sessions were closed."
  (let ((ids nil) (closed 0))
    (maphash (lambda (id _session) (push id ids)) magent-store--sessions)
    (dolist (id ids closed)
      (condition-case err
          (progn (magent-store-close id)
                 (setq closed (1+ closed)))
        (error (message "magent-store: session %s not closed: %s"
                        id (error-message-string err)))))))

(defun magent-store-move (session-id scope)
  "Keep SESSION-ID under SCOPE from now on: its files move there.
SCOPE is as for `magent-store-open'.  What Emacs holds of the session
is flushed first; one already under SCOPE is left as it is.  Signal an
error naming why when it cannot move: it then stays where it was."
  (let ((session (magent-store--get session-id)))
    (unless (equal scope (magent-store--session-scope session))
      (magent-store-flush session-id)
      (magent-store--call "move"
                          (list (magent-store-json-text (magent-store--root))
                                (magent-store--scope-json scope)
                                session-id))
      (setf (magent-store--session-scope session) scope))))

(defun magent-store-flush-all ()
  "Flush every open session, waiting until each is durable."
  (when magent-store--backend
    (maphash (lambda (id _session)
               (condition-case err
                   (magent-store-flush id)
                 (error (message "magent-store: %s"
                                 (error-message-string err)))))
             magent-store--sessions)))

;;;; Commands

;;;###autoload
(defun magent-store-start (&optional offer-install)
  "Start the backend (if it is not running) and return it.
With OFFER-INSTALL (interactively, always), offer to install the
backend when it is missing; return nil if the user accepts (the
backend starts when the installation is done)."
  (interactive (list t))
  (setq magent-store--gave-up nil)
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
    (let ((backend (magent-store--ready-backend)))
      (when offer-install
        (message "magent-store: backend pid %s on port %s"
                 (magent-store--backend-pid backend)
                 (magent-store--backend-port backend)))
      backend)))

(defun magent-store--shutdown (backend)
  "Ask BACKEND to stop, and wait (a few seconds at most) until it has exited.
It closes every session and removes its spool itself: it is killed only
if it does not exit in time."
  (setf (magent-store--backend-stopping backend) t)
  (when (magent-store--backend-ready backend)
    (ignore-errors (magent-store--send "shutdown" nil #'ignore #'ignore)))
  (magent-store--await-exit backend)
  (magent-store--kill-backend backend))

;;;###autoload
(defun magent-store-stop (&optional discard)
  "Flush everything and stop the backend; sessions must be reopened after.
When some entries could not be saved (a full disk, say), nothing is
stopped and an error says so; with DISCARD (a prefix argument) the
backend is stopped all the same and those entries are dropped."
  (interactive "P")
  (let ((running magent-store--backend)
        (count (hash-table-count magent-store--sessions)))
    (when running
      (magent-store-flush-all)
      (let ((unsaved 0))
        (maphash (lambda (_id session)
                   (cl-incf unsaved (magent-store--unsaved session)))
                 magent-store--sessions)
        (when (and (> unsaved 0) (not discard))
          (user-error "%d entries are not saved yet (%s); not stopped: \
C-u M-x magent-store-stop drops them" unsaved
                      (or magent-store--last-error "see the backend log"))))
      (maphash (lambda (_id session) (magent-store--session-detach session))
               magent-store--sessions)
      (magent-store--shutdown magent-store--backend))
    (setq magent-store--recent nil
          magent-store--recovering nil
          ;; What went wrong before a deliberate stop is no longer news.
          magent-store--last-error nil)
    (clrhash magent-store--sessions)
    (message "magent-store: %s"
             (if running
                 (format "backend stopped, %d session%s flushed"
                         count (if (= count 1) "" "s"))
               "the backend was not running"))))

;;;###autoload
(defun magent-store-restart ()
  "Restart the backend, reopening sessions and resending unsaved entries.
Emacs does not wait: the sessions are reopened once the backend is up."
  (interactive)
  (maphash (lambda (_id session) (magent-store--session-detach session))
           magent-store--sessions)
  (when magent-store--backend
    (magent-store--shutdown magent-store--backend))
  (setq magent-store--gave-up nil
        magent-store--restarts nil
        magent-store--recovering (float-time))
  (magent-store--start-backend)
  (message "magent-store: backend restarting; unsaved entries are sent \
again once it is up"))

;;;; The status buffer (magent-store-status.el)

(autoload 'magent-store-status "magent-store-status" nil t)

;;;; Searching past sessions (magent-store-search.el)

(autoload 'magent-store-search "magent-store-search" nil t)
(autoload 'magent-store-scan "magent-store-scan" nil t)
(autoload 'magent-store-scrub "magent-store-scan" nil t)
(autoload 'magent-store-find-session "magent-store-find" nil t)
(autoload 'magent-store-export-session "magent-store-export" nil t)

;;;; Moving a project's sessions (magent-store-relocate.el)

(autoload 'magent-store-relocate "magent-store-relocate" nil t)

;;;; Lifecycle timing (magent-store-timing.el)

(autoload 'magent-store-install-backend "magent-store-install" nil t)

(autoload 'magent-store-record-timing "magent-store-timing")
(autoload 'magent-store-timing-report "magent-store-timing" nil t)

;;;; The mode: the adapter to magent (magent-store-magent.el)

;; Loaded when the mode is first turned on, never by this file: the
;; adapter requires the core, and the core knows nothing of magent.
(autoload 'magent-store-mode "magent-store-magent" nil t)
(autoload 'magent-store-export-for-magent "magent-store-magent" nil t)

(provide 'magent-store)
;;; magent-store.el ends here
