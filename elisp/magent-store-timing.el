;;; magent-store-timing.el --- Privacy-safe lifecycle timing for magent-store  -*- lexical-binding: t; -*-

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

;; Where does a turn's time go?  This file records *when* things happen
;; in a magent turn -- never *what* happens -- and ships the records to
;; the magent-store backend, which appends them to metrics.jsonl in its
;; state directory; `magent-store report' (or
;; \\[magent-store-timing-report]) turns them into per-turn timelines and
;; per-kind statistics.
;;
;; Sources of records:
;;
;; - magent's lifecycle events (`magent-lifecycle-events-add-sink'), while
;;   `magent-store-mode' is on: turn, LLM request, tool call and subagent
;;   starts and ends.
;; - magent's normalized provider events (`magent-agent-loop-apply-event',
;;   advised while the mode is on): the first event of each request and
;;   the reasoning spans.
;; - the shim itself: every flush (a session save: the backend's time
;;   to apply and write it, the entries and bytes).
;; - anyone: (magent-store-record-timing TYPE &rest PROPS), e.g. an ACP
;;   client timing its updates.
;;
;; Privacy: a record is (TYPE TURN-ID MICROSECONDS . PROPS) where PROPS
;; hold only counts, sizes, durations, ordinals and a status word (see
;; `magent-store-timing--number-keys'); the backend stores a digest of
;; the turn id, not the id.  Tool names and arguments, file
;; names, prompts, model output and error messages are never read into
;; a record; a tool call or subagent is known by an ordinal, not its id.
;; The backend applies the same allow-list again before writing.
;;
;; Cost: recording is one `push' onto a queue, like a streamed chunk.
;; The queue rides the next flush message of any session (no message of
;; its own); when no flush comes within `magent-store-timing-send-delay'
;; it goes alone, in one message.
;;
;; Time: Emacs 28 has no monotonic clock.  Records carry `float-time'
;; (magent's own :time when the event has one) as integer microseconds;
;; the backend converts each batch to its monotonic clock with the
;; wall-minus-monotonic offset read when the batch arrives, so a clock
;; step between batches is corrected, and it flags the rare batch whose
;; offset moved (a step within the second before it was sent).

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'magent-store)

(declare-function magent-lifecycle-events-add-sink "ext:magent-lifecycle-events" (sink))
(declare-function magent-lifecycle-events-remove-sink "ext:magent-lifecycle-events" (sink))
(declare-function magent-lifecycle-events-context-turn-id "ext:magent-lifecycle-events" (context))
(declare-function magent-lifecycle-events-context-subagent-id "ext:magent-lifecycle-events"
                  (context))
(declare-function magent-agent-loop-event-context "ext:magent-agent-loop" (loop))
(declare-function magent-llm-event-type "ext:magent-llm" (event))

;;;; Customization

(defcustom magent-store-timing-enabled t
  "Non-nil means record lifecycle timing while `magent-store-mode' is on."
  :type 'boolean
  :group 'magent-store)

(defcustom magent-store-timing-send-delay 1.0
  "Seconds records wait for a session flush to carry them.
After that they are sent in a message of their own."
  :type 'number
  :group 'magent-store)

(defcustom magent-store-timing-max-queued 10000
  "Records kept in Emacs while no backend runs; the oldest are dropped."
  :type 'natnum
  :group 'magent-store)

;;;; What a record may hold

(defconst magent-store-timing-types
  '(turn-start turn-end llm-request-start llm-request-end
               tool-call-start tool-call-end subagent-start subagent-stop
               first-provider-event reasoning-start reasoning-end
               session-save acp-update)
  "The event types a timing record may have.")

(defconst magent-store-timing--number-keys
  '(:duration-ms :backend-ms :count :bytes :chunks :items :messages :tools
                 :call :agent :request)
  "Property keys a record keeps when their value is a non-negative number.")

(defconst magent-store-timing--statuses
  '(completed failed cancelled interrupted aborted error timeout)
  "The words a record's :status may be; any other status is left out.")

;;;; State

(defvar magent-store-timing--queue nil
  "Records not yet sent, newest first.")

(defvar magent-store-timing--timer nil
  "Timer that sends the queue when no flush carried it.")

(defvar magent-store-timing--turn nil
  "Id of the turn in progress, from the last turn-start.")

(defvar magent-store-timing--turn-start 0.0
  "When the turn in progress started (`float-time').")

(defvar magent-store-timing--last-turn nil
  "(TURN-ID START END) of the last turn that ended.")

(defvar magent-store-timing--ordinals (make-hash-table :test #'equal)
  "Tool call and subagent ids -> the ordinal that stands for them.")

(defvar magent-store-timing--next-ordinal 0
  "The last ordinal given out.")

(defvar magent-store-timing--awaiting
  (make-hash-table :test #'eq :weakness 'key)
  "Lifecycle contexts whose request still awaits its first provider event.")

(defvar magent-store-timing--reasoning
  (make-hash-table :test #'eq :weakness 'key)
  "Lifecycle contexts whose provider is reasoning.")

;;;; Recording

(defun magent-store-timing--props (props)
  "Return the allow-listed part of the plist PROPS."
  (let (out)
    (while props
      (let ((key (car props))
            (value (cadr props)))
        (cond ((memq key magent-store-timing--number-keys)
               (when (and (numberp value) (>= value 0))
                 (push value out)
                 (push key out)))
              ((eq key :status)
               (let ((word (if (stringp value) (intern-soft value) value)))
                 (when (and word (memq word magent-store-timing--statuses))
                   (push word out)
                   (push key out))))))
      (setq props (cddr props)))
    out))

(defsubst magent-store-timing--push (type turn time props)
  "Queue a record of TYPE in TURN at TIME with PROPS.
TIME is a `float-time', a Lisp timestamp, or nil for now."
  (push (cons type (cons (and (stringp turn) turn)
                         (cons (truncate (* 1000000 (if (numberp time)
                                                        time
                                                      (float-time time))))
                               props)))
        magent-store-timing--queue)
  (unless magent-store-timing--timer
    (setq magent-store-timing--timer
          (run-at-time magent-store-timing-send-delay nil
                       #'magent-store-timing--send))))

;;;###autoload (autoload 'magent-store-record-timing "magent-store-timing")
(defun magent-store-record-timing (type &rest props)
  "Record a timing event of TYPE with PROPS; return non-nil if recorded.
TYPE is one of `magent-store-timing-types', e.g. `first-provider-event',
`acp-update', `reasoning-start'.  PROPS may hold :turn-id (default: the
turn in progress), :time (a `float-time' or Lisp timestamp, default
now; for an event with a duration, its end), :duration-ms,
:count, :bytes, :chunks, :items, :messages and :status (one of
`magent-store-timing--statuses').  Anything else in PROPS is dropped:
records hold no content, names or messages.  Costs one `push'."
  (when (and magent-store-timing-enabled
             (memq type magent-store-timing-types))
    (magent-store-timing--push
     type (or (plist-get props :turn-id) magent-store-timing--turn)
     (plist-get props :time) (magent-store-timing--props props))
    t))

(defun magent-store-timing--take ()
  "Return the queued records, oldest first, as extra flush arguments.
This is `magent-store-flush-extra-args-function': the records ride the
flush message being sent."
  (when magent-store-timing--queue
    (prog1 (list (nreverse magent-store-timing--queue))
      (setq magent-store-timing--queue nil))))

(defun magent-store-timing--live-backend ()
  "Return the backend when it can take a message, else nil."
  (let ((backend magent-store-current-backend))
    (and backend
         (not (magent-store-backend-stopping backend))
         (process-live-p (magent-store-backend-connection backend))
         backend)))

(defun magent-store-timing--send ()
  "Send the records no flush carried, in one message."
  (setq magent-store-timing--timer nil)
  (when magent-store-timing--queue
    (if (magent-store-timing--live-backend)
        (condition-case nil
            (magent-store-send "record-timings" (magent-store-timing--take)
                                nil #'ignore)
          (error nil))
      ;; No backend: keep the newest, a bounded number.
      (let ((tail (nthcdr (max 0 (1- magent-store-timing-max-queued))
                          magent-store-timing--queue)))
        (when tail (setcdr tail nil))))))

(defun magent-store-timing--turn-at (time)
  "Return the id of the turn in progress at TIME, or ended just before it."
  (let ((last magent-store-timing--last-turn))
    (cond ((and magent-store-timing--turn
                (>= time magent-store-timing--turn-start))
           magent-store-timing--turn)
          ((and last (<= (nth 1 last) time (+ (nth 2 last) 2.0)))
           (car last)))))

(defun magent-store-timing--flushed (sent numbered reply)
  "Record the session save of the batch NUMBERED sent at SENT.
REPLY is the backend's answer to it.
This is `magent-store-flushed-function'.  The save's duration is the
backend's own (apply and write, REPLY's milliseconds), placed from SENT:
the round trip is no measure, as the backend may delay a tick's reply.
A save belongs to the turn in progress, or to the turn that ended
less than two seconds before it (the save that ends a turn); other
saves are not recorded.  Which turn is decided by SENT: a tick's reply
may come after the next turn began."
  (let ((turn (magent-store-timing--turn-at sent))
        (ms (nth 3 reply)))
    (when (and turn magent-store-timing-enabled (numberp ms))
      (magent-store-timing--push
       'session-save turn (+ sent (/ ms 1000.0))
       (magent-store-timing--props
        (list :duration-ms ms
              :items (/ (nth 2 numbered) magent-store-entry-slots)
              :bytes (nth 2 reply)))))))

;;;; magent's lifecycle events and provider events

(defun magent-store-timing--ordinal (id &optional forget)
  "Return the ordinal standing for ID; with FORGET, release it."
  (let ((n (or (gethash id magent-store-timing--ordinals)
               (puthash id (cl-incf magent-store-timing--next-ordinal)
                        magent-store-timing--ordinals))))
    (when forget (remhash id magent-store-timing--ordinals))
    n))

(defun magent-store-timing--sink (event)
  "Record magent lifecycle EVENT (a plist): its type, turn, time and counts."
  (when magent-store-timing-enabled
    (let* ((type (plist-get event :type))
           (turn (plist-get event :turn-id))
           (time (plist-get event :time))
           (subagent (plist-get event :subagent-id))
           (agent (and subagent
                       (list :agent (magent-store-timing--ordinal subagent)))))
      (pcase type
        ('turn-start
         (unless subagent
           (setq magent-store-timing--turn turn
                 magent-store-timing--turn-start (if (numberp time) time
                                                   (float-time))))
         (magent-store-timing--push type turn time agent))
        ('turn-end
         (magent-store-timing--push
          type turn time
          (nconc (magent-store-timing--props
                  (list :status (plist-get event :status)))
                 agent))
         (when (equal turn magent-store-timing--turn)
           (setq magent-store-timing--turn nil
                 magent-store-timing--last-turn
                 (list turn magent-store-timing--turn-start
                       (if (numberp time) time (float-time))))))
        ('llm-request-start
         (puthash (or (plist-get event :context) 'none) t
                  magent-store-timing--awaiting)
         (magent-store-timing--push
          type turn time
          (nconc (magent-store-timing--props
                  (list :messages (plist-get event :prompt-count)
                        :tools (plist-get event :tool-count)
                        :bytes (plist-get event :request-bytes)))
                 agent)))
        ('llm-request-end
         (magent-store-timing--push
          type turn time
          (nconc (magent-store-timing--props
                  (list :status (plist-get event :status)))
                 agent)))
        ('tool-call-start
         (magent-store-timing--push
          type turn time
          (nconc (list :call (magent-store-timing--ordinal
                              (plist-get event :call-id)))
                 agent)))
        ('tool-call-end
         (magent-store-timing--push
          type turn time
          (nconc (list :call (magent-store-timing--ordinal
                              (plist-get event :call-id) t))
                 (magent-store-timing--props
                  (list :status (plist-get event :status)))
                 agent)))
        ('subagent-start
         (magent-store-timing--push type turn time agent))
        ('subagent-stop
         (magent-store-timing--push type turn time agent)
         (when subagent (remhash subagent magent-store-timing--ordinals)))))))

(defun magent-store-timing--before-apply-event (loop event)
  "Note the first provider EVENT of LOOP's request, and reasoning spans.
Advice before `magent-agent-loop-apply-event': two hash lookups."
  (let* ((context (and (fboundp 'magent-agent-loop-event-context)
                       (magent-agent-loop-event-context loop)))
         (key (or context 'none)))
    (when (gethash key magent-store-timing--awaiting)
      (remhash key magent-store-timing--awaiting)
      (magent-store-timing--context-record 'first-provider-event context))
    (if (eq (magent-llm-event-type event) 'reasoning-delta)
        (unless (gethash key magent-store-timing--reasoning)
          (puthash key t magent-store-timing--reasoning)
          (magent-store-timing--context-record 'reasoning-start context))
      (when (gethash key magent-store-timing--reasoning)
        (remhash key magent-store-timing--reasoning)
        (magent-store-timing--context-record 'reasoning-end context)))))

(defun magent-store-timing--context-record (type context)
  "Record TYPE now, in the turn and agent of lifecycle CONTEXT."
  (let ((subagent (and context
                       (magent-lifecycle-events-context-subagent-id context))))
    (magent-store-timing--push
     type (if context
              (magent-lifecycle-events-context-turn-id context)
            magent-store-timing--turn)
     nil (and subagent
              (list :agent (magent-store-timing--ordinal subagent))))))

;;;; Switching on and off with `magent-store-mode'

(defun magent-store-timing-mode-sync ()
  "Register the timing sink and advice with magent iff `magent-store-mode' is on.
Run by `magent-store-mode-hook', and again when magent loads later."
  (let ((on (and (bound-and-true-p magent-store-mode)
                 magent-store-timing-enabled)))
    (if on
        (when (fboundp 'magent-lifecycle-events-add-sink)
          (magent-lifecycle-events-add-sink #'magent-store-timing--sink))
      (when (fboundp 'magent-lifecycle-events-remove-sink)
        (magent-lifecycle-events-remove-sink #'magent-store-timing--sink)))
    (if (and on (fboundp 'magent-agent-loop-apply-event)
             (fboundp 'magent-llm-event-type))
        (advice-add 'magent-agent-loop-apply-event :before
                    #'magent-store-timing--before-apply-event)
      (advice-remove 'magent-agent-loop-apply-event
                     #'magent-store-timing--before-apply-event))
    ;; Until both of magent's sources are loaded, look again after each
    ;; load (the mode may be turned on before magent is).
    (if (and on (not (and (fboundp 'magent-lifecycle-events-add-sink)
                          (fboundp 'magent-agent-loop-apply-event))))
        (add-hook 'after-load-functions #'magent-store-timing--after-load)
      (remove-hook 'after-load-functions
                   #'magent-store-timing--after-load))))

(defun magent-store-timing--after-load (_file)
  "Register with magent's timing sources loaded after the mode was turned on."
  (when (or (featurep 'magent-lifecycle-events)
            (featurep 'magent-agent-loop))
    (magent-store-timing-mode-sync)))

(add-hook 'magent-store-mode-hook #'magent-store-timing-mode-sync)

(setq magent-store-flush-extra-args-function #'magent-store-timing--take
      magent-store-flushed-function #'magent-store-timing--flushed)

;;;; The report

(defun magent-store-timing-flush ()
  "Send the queued records now and wait until the backend has written them."
  (when magent-store-timing--timer
    (cancel-timer magent-store-timing--timer)
    (setq magent-store-timing--timer nil))
  (when (and magent-store-timing--queue (magent-store-timing--live-backend))
    (magent-store-call "record-timings" (magent-store-timing--take))))

;;;###autoload
(defun magent-store-timing-report (&optional args)
  "Show `magent-store report' (with extra command-line ARGS) read-only.
With a prefix argument, ask from when (--since)."
  (interactive
   (list (and current-prefix-arg
              (list "--since"
                    (read-string "Since (2026-11-29, 2026-11-29T14:00, 12h, 7d): ")))))
  (ignore-errors (magent-store-timing-flush))
  (let ((command (append (butlast (magent-store-program-command))
                         (cons "report" args)))
        (buffer (get-buffer-create "*magent-store-report*")))
    (with-current-buffer buffer
      (let ((inhibit-read-only t)
            (coding-system-for-read 'utf-8-unix))
        (erase-buffer)
        (apply #'call-process (car command) nil t nil (cdr command)))
      (special-mode)
      (goto-char (point-min)))
    (when (called-interactively-p 'interactive)
      (display-buffer buffer))
    buffer))

(provide 'magent-store-timing)
;;; magent-store-timing.el ends here
