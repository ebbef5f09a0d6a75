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
;; else: it forwards, buffers and schedules.  It holds each session's
;; queue, what is sent again after the backend stopped, and the public
;; functions, and knows only sessions, events, chunks and flushes.  The
;; connection to the backend is magent-store-connection.el, under this
;; file; `magent-store-mode' and the adapter to magent are in
;; magent-store-magent.el, loaded when the mode is first turned on.
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
;;   3. M-x magent-store-install-backend, once, into a private virtualenv
;;      (a backend installed with pip, or a checkout's .venv, is found).
;;
;; The URL above is magent's: magent-store has no repository of its own.
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
(require 'magent-store-connection)
(require 'magent-store-loaddefs)   ; the other files' commands

;;;; Customization

(defconst magent-store-version "0.1.0"
  "The version of this package; the backend it talks to should match it.")

(defcustom magent-store-root nil
  "Directory under which sessions are stored (magent's session root).
nil means `magent-session-directory' when magent defines it (looked up
when a session opens, so load order does not matter), else
magent/sessions under `user-emacs-directory'."
  :type '(choice (const :tag "magent's session directory" nil) directory)
  :group 'magent-store)

(defvar magent-store-default-root-function nil
  "Nil, or a function of no argument returning the default session root.
The adapter of the agent whose sessions are stored sets it, when it
loads: the core does not know where that agent keeps its sessions.")

(defun magent-store-session-root ()
  "Return the session root in use, as an absolute directory name."
  (expand-file-name
   (or magent-store-root
       (and magent-store-default-root-function
            (funcall magent-store-default-root-function))
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

;;;; State

(defun magent-store--new-producer ()
  "Return a fresh writer name, unique to this Emacs: its pid and randomness."
  (format "%x-%x-%x" (emacs-pid) (random most-positive-fixnum) (truncate (float-time))))

(cl-defstruct (magent-store--session (:constructor magent-store--session-make)
                                     (:copier nil))
  "What Emacs holds for one open session.
BATCH is a vector whose first FILL slots hold the entries not yet sent,
oldest first, `magent-store-entry-slots' slots each (see
`magent-store--enqueue'); INFLIGHT the batches sent but not yet
acknowledged, oldest first, as (NUMBER BATCH FILL): batches are
numbered per PRODUCER (this session object), so that the backend
applies a batch sent again only if its log does not hold it yet.
HELD the batches acknowledged whose text redaction still holds back
in the backend's memory (the reply's released number is below them):
kept, oldest first, until a reply releases them, and sent again first
should the backend stop.  NUMBER is the last number given.  OPENING is
non-nil while the backend opens the session, RETRY the timer that sends
refused batches again, REFUSAL what the backend last said of one.
WRITTEN-SEQ is the last seq the backend wrote to the log file (it
survives a crash of the backend); DURABLE-SEQ the last one fsync covers.
DEADLINE is when the scheduled flush is due (a float), nil when none is;
TIMER the timer that sends it if no chunk or reply does first.  INITIAL,
nil or the JSON text of the thread a session starts from when the
backend has no files for it; WRITES-AS: `magent-store-session-wire-id'."
  id scope batch (fill 0) (queued-chars 0) inflight (durable-seq 0)
  (written-seq 0) timer (flushes 0) header opened deadline initial
  (producer (magent-store--new-producer)) (number 0) opening retry refusal
  held writes-as)

(defsubst magent-store-session-wire-id (session)
  "Return the id the backend knows SESSION by: its own, or its fork's.
When another machine went on with it meanwhile, it went on as a fork."
  (or (magent-store--session-writes-as session) (magent-store--session-id session)))

(defvar magent-store--sessions (make-hash-table :test #'equal)
  "Open sessions: session id -> `magent-store--session'.")

(defvar magent-store-flush-ms nil
  "Recent flush round-trip times in milliseconds, newest first.")

(defvar magent-store-persistence-enabled t
  "When nil, the append functions drop their input (for benchmarks only).")

(defvar magent-store-flush-extra-args-function nil
  "Nil, or a function returning extra arguments for the next flush message.
magent-store-timing sets it, so that its records ride the flush.")

(defvar magent-store-flushed-function nil
  "Nil, or a function called with (SENT NUMBERED REPLY) after each flush.
SENT is when the batch was sent, NUMBERED the batch with its number,
\(NUMBER BATCH FILL LARGE), and REPLY the backend's reply.
magent-store-timing sets it to time the round trip as a session save.")

;;;; Recovery

(defcustom magent-store-retry-interval 5
  "Seconds between attempts to send again a batch the backend refused.
A refused batch (a full disk, say) stays in Emacs until it is saved."
  :type 'number
  :group 'magent-store)

(defun magent-store--session-detach (session)
  "Forget that SESSION is open on a backend; cancel its timers."
  (dolist (timer (list (magent-store--session-timer session)
                       (magent-store--session-retry session)))
    (when timer (cancel-timer timer)))
  (setf (magent-store--session-timer session) nil
        (magent-store--session-retry session) nil
        (magent-store--session-opened session) nil
        (magent-store--session-opening session) nil))

(defun magent-store--detach-all ()
  "Forget that every session is open on a backend: it went away."
  (maphash (lambda (_id session) (magent-store--session-detach session))
           magent-store--sessions))

(defun magent-store--reopen-all ()
  "Open every session the backend, which just took our token, does not hold.
With none, have it make the root's store ready, not in magent's first save."
  (when (hash-table-empty-p magent-store--sessions)
    (magent-store-send "prepare" (list (magent-store-json-text (magent-store-session-root))
                                       (magent-store--store-options-json))
                       nil #'ignore))
  (maphash (lambda (_id session)
             (unless (or (magent-store--session-opened session)
                         (magent-store--session-opening session))
               (magent-store--reopen session)))
           magent-store--sessions))

(defun magent-store--send-kept ()
  "Send what each session queued while the backend did not answer.
A header put meanwhile goes first (the backend writes it only if it
changed); a session waiting for a retry sends at its retry."
  (maphash (lambda (_id session)
             (when (magent-store--sendable-p session)
               (when-let ((header (magent-store--session-header session)))
                 (magent-store-send "put-header" (list (magent-store-session-wire-id session) header)
                                    nil #'ignore))
               (when (> (magent-store--session-fill session) 0)
                 (if (magent-store--session-inflight session)
                     ;; The reply to the batch in flight sends the queue
                     ;; (`magent-store--after-reply'), if a flush is due:
                     ;; the one that came meanwhile could not send it.
                     (unless (magent-store--session-deadline session)
                       (setf (magent-store--session-deadline session) (float-time)))
                   (magent-store--flush-now session t)))))
           magent-store--sessions))

(setq magent-store-ready-function #'magent-store--reopen-all
      magent-store-answering-function #'magent-store--send-kept
      magent-store-detach-function #'magent-store--detach-all)

(defun magent-store--maybe-recovered ()
  "Say so once every session has everything saved after a restart."
  (when (and magent-store-recovering
             (magent-store-ready-p magent-store-current-backend)
             (catch 'pending
               (maphash (lambda (_id session)
                          (when (or (not (magent-store--session-opened session))
                                    (magent-store--session-inflight session))
                            (throw 'pending nil)))
                        magent-store--sessions)
               t))
    (setq magent-store-recovering nil)
    (message "magent-store: the backend stopped and was restarted; \
everything it had not saved was sent again and is saved")))

(defun magent-store--reopen (session)
  "Open SESSION on the backend, then send again what it has not saved.
Each unacknowledged batch goes again under its own number: the backend
skips the ones already in its log.  Then the queue follows."
  (setf (magent-store--session-opening session) t)
  (magent-store-send
   "open" (magent-store--open-args session)
   (lambda (last-seq)
     (setf (magent-store--session-opening session) nil
           (magent-store--session-opened session) t)
     (unless (magent-store--session-inflight session)
       (setf (magent-store--session-durable-seq session) last-seq
             (magent-store--session-written-seq session) last-seq))
     (when-let ((header (magent-store--session-header session)))
       (magent-store-send "put-header"
                           (list (magent-store-session-wire-id session) header)
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
text redaction holds back held, so a split secret is still caught.
Called by the retry timer, and by the reply to the session's opening
inside the process filter: sent later, a chunk's flush could overtake
them, and batches never overtake each other.  Only after a restart or
a refusal do batches go again."
  (when-let ((held (magent-store--session-held session)))
    (setf (magent-store--session-inflight session)
          (sort (append held (magent-store--session-inflight session))
                (lambda (a b) (< (car a) (car b))))
          (magent-store--session-held session) nil))
  (dolist (numbered (magent-store--session-inflight session))
    (magent-store--send-batch session numbered t))
  (if (> (magent-store--session-fill session) 0)
      (magent-store--flush-now session t)
    (magent-store--maybe-recovered)))

(defun magent-store--refused (session why)
  "The backend refused a batch or the opening of SESSION because of WHY.
Nothing is dropped: everything stays in Emacs and is sent again after
`magent-store-retry-interval' seconds, until the backend has it."
  ;; "Came before batch" only follows another refusal: the first says
  ;; why (the connection made the last error whatever the backend said).
  (setq magent-store-last-error
        (or (and (string-match-p "came before batch" why)
                 (magent-store--session-refusal session))
            why))
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
  (let ((backend magent-store-current-backend))
    (when (and (magent-store-ready-p backend)
               (eq session (gethash (magent-store--session-id session)
                                    magent-store--sessions)))
      (cond ((magent-store-backend-unresponsive backend)
             ;; Nothing is sent to a backend that does not answer: later.
             (setf (magent-store--session-retry session)
                   (run-at-time magent-store-retry-interval nil
                                #'magent-store--retry session)))
            ((magent-store--session-opening session))
            ((not (magent-store--session-opened session))
             (magent-store--reopen session))
            (t (magent-store--resend session))))))

;;;; Sessions and batches

(defun magent-store--store-options-json ()
  "Return the options that choose a root's store, as JSON text."
  (magent-store-json-encode
   `((fsync . ,(symbol-name magent-store-fsync))
     (log-max-events . ,magent-store-log-max-events))))

(defun magent-store--options-json ()
  "Return the store options as JSON text.
With `magent-store-redact' on, they hold the redaction spec, secrets
included: the options are never logged."
  (let ((options (magent-store--store-options-json))
        (spec (magent-store-redact-spec-json)))
    (if spec
        (concat (substring options 0 -1) ",\"redact\":" spec "}")
      options)))

(defun magent-store--open-args (session)
  "Return the arguments of the open call for SESSION."
  (let ((args (list (magent-store-json-text (magent-store-session-root))
                    (magent-store-scope-json
                     (magent-store--session-scope session))
                    (magent-store-session-wire-id session)
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

(defun magent-store-ensure-session (session-id scope &optional initial)
  "Return session SESSION-ID under SCOPE, opening it (without waiting) if needed.
INITIAL, JSON text of a thread snapshot, is the state the backend starts
the session from when it has no files for it."
  (or (gethash session-id magent-store--sessions)
      (let ((session (magent-store--session-make :id session-id :scope scope
                                                 :initial initial)))
        (puthash session-id session magent-store--sessions)
        (condition-case err
            (let ((backend (magent-store-ensure-backend)))
              ;; A backend still starting opens it once it is ready.
              (when (magent-store-ready-p backend)
                (magent-store--reopen session)))
          (error (magent-store-give-up (error-message-string err))))
        session)))

(defsubst magent-store--due (session now)
  "Schedule SESSION's flush, or send it now (NOW, a float) if its time has come.
While chunks stream, the flush goes out with the first one after its
deadline: that chunk already woke Emacs up, a timer would wake it again.
See `magent-store--schedule' for what catches a stream that stopped."
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
    (when (> (+ fill magent-store-entry-slots) (length batch))
      (setq batch (magent-store--grow session)))
    (aset batch fill a)
    (aset batch (+ fill 1) b)
    (aset batch (+ fill 2) c)
    (aset batch (+ fill 3) d)
    (setf (magent-store--session-fill session)
          (+ fill magent-store-entry-slots))))

(defun magent-store--recycle (batch)
  "Clear BATCH, a vector the backend has acknowledged, and keep it for reuse."
  (when (and batch (<= (length batch) 4096)
             (< (length magent-store--batch-pool) magent-store--batch-pool-max))
    (fillarray batch nil)
    (push batch magent-store--batch-pool)))

(defun magent-store--unsaved (session)
  "Return the number of entries of SESSION the backend has not saved."
  (/ (+ (magent-store--session-fill session)
        (apply #'+ (mapcar (lambda (numbered) (nth 2 numbered))
                           (append (magent-store--session-held session)
                                   (magent-store--session-inflight session)))))
     magent-store-entry-slots))

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

(defun magent-store--schedule (session now)
  "Schedule SESSION's flush one interval after NOW.
A chunk after the deadline sends it.  Should the stream stop, a timer
sends it, a little after the deadline; but while a batch of SESSION
awaits its reply, that reply comes within a second (the backend delays
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
The backend may delay the reply and send it with later ones
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
  (and (magent-store-ready-p magent-store-current-backend)
       (not (magent-store-backend-unresponsive magent-store-current-backend))
       (magent-store--session-opened session)
       (not (magent-store--session-retry session))))

(defun magent-store--flush-now (session &optional tick)
  "Send SESSION's queue as one batch, to be applied and flushed.
Chunks travel as (ITEM-ID CHUNK OUTPUT-P TIME) lists and events as their
JSON text, printed straight from the batch vector into the message: no
per-chunk JSON, no list built.  With TICK, send it as a tick, whose
reply the backend may delay.  The batch gets the session's next
number and stays in INFLIGHT until the backend says it is in the log;
an empty batch still flushes (the header, say).  While the session
cannot send, its entries stay queued."
  (when (magent-store--sendable-p session)
    (let* ((fill (magent-store--session-fill session))
           (batch (and (> fill 0) (magent-store--session-batch session)))
           (large (> (magent-store--session-queued-chars session)
                     magent-store-file-threshold))
           (numbered (list (cl-incf (magent-store--session-number session))
                         batch fill large)))
      (when batch
        (setf (magent-store--session-batch session)
              (pop magent-store--batch-pool)))
      (setf (magent-store--session-fill session) 0
            (magent-store--session-queued-chars session) 0)
      (setf (magent-store--session-inflight session)
            (nconc (magent-store--session-inflight session) (list numbered)))
      (cl-incf (magent-store--session-flushes session))
      (magent-store--send-batch
       session numbered tick
       (and magent-store-flush-extra-args-function
            (funcall magent-store-flush-extra-args-function))))))

(defun magent-store--send-batch (session numbered tick &optional extra)
  "Send the batch NUMBERED, (NUMBER BATCH FILL LARGE), of SESSION.
With TICK as a tick; EXTRA is the list of extra arguments (timing
records).  A LARGE batch travels as a file, or in the message when
the file cannot be written (a full disk) or redaction is on (the file
would be an unredacted copy on disk)."
  (let* ((backend magent-store-current-backend)
         (id (magent-store-session-wire-id session))
         (ident (list (magent-store--session-producer session) (car numbered)))
         (sent (float-time))
         (file (and (nth 3 numbered)
                    (not magent-store-redact)
                    (ignore-errors
                      (magent-store-spool-file backend #'magent-store-print-batch
                                               (nth 1 numbered) (nth 2 numbered))))))
    (condition-case nil
        (if file
            (magent-store-send (if tick "tick-file" "flush-file")
                                (list id file (car extra) ident)
                                (magent-store--on-flushed session numbered sent)
                                (magent-store--on-refused session numbered))
          (magent-store-send (if tick "tick" "flush")
                              (list id numbered (car extra) ident)
                              (magent-store--on-flushed session numbered sent)
                              (magent-store--on-refused session numbered)
                              #'magent-store-print-flush-args))
      ;; The connection is gone: the sentinel restarts and resends.
      (error nil))))

(defun magent-store--on-flushed (session numbered sent)
  "Return the reply handler of the batch NUMBERED of SESSION sent at SENT."
  (lambda (reply)
    ;; A batch sent again may be answered twice: the first answer counts.
    (when (memq numbered (magent-store--session-inflight session))
      (setf (magent-store--session-inflight session)
            (delq numbered (magent-store--session-inflight session))
            (magent-store--session-durable-seq session) (nth 0 reply)
            (magent-store--session-written-seq session) (nth 1 reply))
      (magent-store--release session numbered (or (nth 5 reply) (car numbered)))
      (push (* 1000 (- (float-time) sent)) magent-store-flush-ms)
      (when (nthcdr 256 magent-store-flush-ms)
        (setcdr (nthcdr 127 magent-store-flush-ms) nil))
      (when magent-store-flushed-function
        (funcall magent-store-flushed-function sent numbered reply))
      (dolist (notice (nth 6 reply))
        (message "magent-store: %s" notice))
      (when-let ((fork (nth 7 reply)))  ; it went on as a fork: called so from now on
        (setf (magent-store--session-writes-as session) fork
              (magent-store--session-initial session) nil))
      (when-let ((rejected (nth 4 reply)))
        (setq magent-store-last-error (car rejected))
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

(defun magent-store--release (session numbered released)
  "Forget SESSION's batches up to number RELEASED; keep NUMBERED if it is after.
NUMBERED was just acknowledged; the backend still holds back some text of
the batches after RELEASED (redaction waits for the end of a word), and
sends them again, should it stop, only if Emacs still has them."
  (let ((held (magent-store--session-held session)))
    (when (> (car numbered) released)
      (setq held (nconc held (list numbered))))
    (while (and held (<= (car (car held)) released))
      (unless (eq (car held) numbered)
        (magent-store--recycle (nth 1 (car held))))
      (setq held (cdr held)))
    (when (<= (car numbered) released)
      (magent-store--recycle (nth 1 numbered)))
    (setf (magent-store--session-held session) held)))

(defun magent-store--on-refused (session numbered)
  "Return the error handler of the batch NUMBERED of SESSION."
  (lambda (why)
    ;; The backend has none of it: keep it and send it again.
    (when (memq numbered (magent-store--session-inflight session))
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
    (magent-store-ready-backend)
    (unless (magent-store--session-opened session)
      (let ((last-seq (magent-store-call "open"
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
                                                    &optional output-p time)
  "Queue CHUNK appended to ITEM-ID's content in SESSION-ID.
With OUTPUT-P, CHUNK is appended to the item's output.  TIME, a float
\(seconds since the epoch), is when it was appended; nil means now.
This is the streaming hot path: it takes the time (one float, unless
given) and allocates nothing else."
  (when (and magent-store-persistence-enabled (stringp chunk)
             (> (length chunk) 0))
    (magent-store--push-chunk (magent-store--get session-id)
                              item-id chunk output-p (or time (float-time)))))

(defun magent-store-put-header (session-id header)
  "Queue HEADER as the header of SESSION-ID, sent before its next flush.
HEADER is an alist or its JSON text, as for `magent-store-append-event'."
  (let ((session (magent-store--get session-id))
        (text (magent-store-json-arg header)))
    (setf (magent-store--session-header session) text)
    ;; Otherwise the session's reopening sends it.
    (when (magent-store--sendable-p session)
      (magent-store-send "put-header" (list (magent-store-session-wire-id session) text) nil
                          (magent-store--header-refused session-id)))))

(defun magent-store--header-refused (session-id)
  "Return a handler of a refusal of SESSION-ID's header: a message and the error."
  (lambda (why)
    (setq magent-store-last-error
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
         (backend (magent-store-ready-backend))
         (process (magent-store-backend-connection backend))
         (deadline (+ (float-time) magent-store-call-timeout)))
    (magent-store-check-answering backend (format "Flush of %s" session-id))
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
                  (magent-store-ready-p backend)
                  (< (float-time) deadline))
        ;; JUST-THIS-ONE an integer: no timers run while we wait.
        (accept-process-output process 0.05 nil 1)
        ;; The session may just have been opened or reopened, its queue
        ;; and its batches sent as ticks, whose replies the backend delays
        ;; up to a second: a flush sent after them has it answer them
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
      (magent-store-signal
       "Flush of %s did not complete%s" session-id
       (cond ((magent-store--session-refusal session)
              (concat ": " (magent-store--session-refusal session)))
             ((not (magent-store-ready-p backend)) ": the backend stopped")
             ((>= (float-time) deadline)
              (concat ": " (magent-store-unanswered backend)))
             (t ""))))
    (magent-store--session-durable-seq session)))

(defun magent-store-load (session-id &optional scope)
  "Open SESSION-ID under SCOPE and return (:header ALIST :snapshot ALIST).
The backend writes the JSON to a private file, read here and deleted:
megabytes never cross the EPC wire."
  (magent-store-ready-backend)
  (when (gethash session-id magent-store--sessions)
    ;; What Emacs still holds must be in the snapshot it gets back.
    (magent-store-flush session-id))
  (let* ((session (or (gethash session-id magent-store--sessions)
                      (magent-store--session-make
                       :id session-id :scope (magent-store--scope-arg scope))))
         (file (magent-store-call "load" (magent-store--open-args session))))
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
  (when-let ((session (gethash session-id magent-store--sessions)))
    (when magent-store-current-backend
      (magent-store-flush session-id)
      (magent-store-call "close" (list (magent-store-session-wire-id session))))
    (setq magent-store--recent nil)
    (remhash session-id magent-store--sessions)))

(defun magent-store-close-all ()
  "Flush every session this Emacs has open, close it in the backend, forget it.
What a tool over the session files (relocate, scrub) needs first: the
backend then holds none of them.  Streaming opens again what it needs
\(magent's next event or chunk).  Never signals; return how many
sessions were closed."
  (let ((closed 0))
    (dolist (id (hash-table-keys magent-store--sessions) closed)
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
      (magent-store-call "move"
                          (list (magent-store-json-text (magent-store-session-root))
                                (magent-store-scope-json scope)
                                (magent-store-session-wire-id session)))
      (setf (magent-store--session-scope session) scope))))

(defsubst magent-store-get-session (session-id)
  "Return the session SESSION-ID this Emacs has open, or nil.
The value is for the functions that take a session: see
`magent-store-session-scope' and `magent-store-session-initial-p'."
  (let ((recent magent-store--recent))
    (if (and recent (eq session-id (car recent)))
        (cdr recent)
      (when-let ((session (gethash session-id magent-store--sessions)))
        (setq magent-store--recent (cons session-id session))
        session))))

(defun magent-store-session-scope (session)
  "Return the scope SESSION is kept under, as for `magent-store-open'."
  (magent-store--session-scope session))

(defun magent-store-session-initial-p (session)
  "Non-nil when SESSION was opened from a state its opener gave.
That is the INITIAL of `magent-store-ensure-session'."
  (and (magent-store--session-initial session) t))

(defun magent-store-forget (session-id)
  "Forget SESSION-ID in Emacs, and drop what Emacs kept of it unsaved.
Its queue is dropped and its timer cancelled; the backend is not told."
  (when-let ((session (gethash session-id magent-store--sessions)))
    (when-let ((timer (magent-store--session-timer session)))
      (cancel-timer timer))
    (remhash session-id magent-store--sessions))
  (setq magent-store--recent nil))

(defun magent-store-flush-unsent (&optional session-id)
  "Flush SESSION-ID (every session when nil) if it has unsaved entries.
That is entries queued or sent and not yet acknowledged, or a flush
scheduled.  A flush that fails is said in a message, never signalled."
  (when magent-store-current-backend
    (maphash (lambda (sid session)
               (when (and (or (null session-id) (equal session-id sid))
                          (or (> (magent-store--session-fill session) 0)
                              (magent-store--session-inflight session)
                              (magent-store--session-deadline session)))
                 (condition-case err
                     (magent-store-flush sid)
                   (error (message "magent-store: %s"
                                   (error-message-string err))))))
             magent-store--sessions)))

(defun magent-store-unsaved-count ()
  "Return how many entries of all sessions the backend has not saved."
  (let ((unsaved 0))
    (maphash (lambda (_id s) (cl-incf unsaved (magent-store--unsaved s))) magent-store--sessions)
    unsaved))

(defun magent-store-forget-all ()
  "Forget every session in Emacs, saved or not; return how many there were."
  (prog1 (hash-table-count magent-store--sessions)
    (setq magent-store--recent nil)
    (clrhash magent-store--sessions)))

(defun magent-store-flush-all ()
  "Flush every open session, waiting until each is durable."
  (when magent-store-current-backend
    (maphash (lambda (id _session)
               (condition-case err
                   (magent-store-flush id)
                 (error (message "magent-store: %s" (error-message-string err)))))
             magent-store--sessions)))

(provide 'magent-store)
;;; magent-store.el ends here
