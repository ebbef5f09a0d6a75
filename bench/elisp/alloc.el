;;; alloc.el --- What persistence allocates per streamed chunk  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Benchmark code, not product code.  Streams chunks at a fixed rate from a
;; repeating timer, as process output would arrive, the way magent records
;; a streamed delta: `magent-thread-append-item-content' then
;; `magent-session-save-deferred-for-session' (magent-agent.el's
;; `record-text-delta') when upstream magent is loaded, else through the
;; public API (`magent-store-append-item-content' and
;; `magent-store-request-flush').  It counts what Emacs allocated over the
;; stream with `memory-use-counts' (deterministic: no sampling), so the
;; bytes of a strategy minus those of the same stream with persistence off
;; are what persistence allocates, ticks, timers and replies included.
;;
;; Strategies:
;; - `none': magent's in-memory work only; the deferred save does nothing.
;; - `store': `magent-store-mode' on (or the public API).
;; - `log': magent's own saving (its deferred save and its save function,
;;   schema 7 when the newer magent-session.el is loaded: the Elisp append
;;   log); needs upstream magent.
;; - `floor': each tick's chunks sent as one JSON line with one bare
;;   `process-send-string' to a pipe; the chunk path pushes one cons.

;;; Code:

(require 'cl-lib)
(require 'magent-store-magent)

(declare-function magent-thread-create "ext:magent-ledger" (&rest args))
(declare-function magent-thread-start-turn "ext:magent-ledger" (thread turn-id))
(declare-function magent-thread-start-item "ext:magent-ledger"
                  (thread turn-id type &rest args))
(declare-function magent-thread-append-item-content "ext:magent-ledger"
                  (thread item chunk &optional output-p))
(declare-function magent-thread-record-user-message-if-needed
                  "ext:magent-ledger" (thread turn-id content &optional phase metadata))
(declare-function magent-session-create "ext:magent-session" (&rest args))
(declare-function magent-session-save-deferred-for-session "ext:magent-session"
                  (session &optional scope delay))
(declare-function magent-session-save-for-session "ext:magent-session"
                  (session scope))
(declare-function magent-store-mode "magent-store-magent" (&optional arg))
(declare-function magent-store-magent--open-thread "magent-store-magent" (thread))
(defvar magent-store-mode)
(defvar magent-session-directory)
(defvar magent-session--pending-saves)
(defvar magent-session--save-timer)

(defconst msb-alloc-words
  ["the" "store" "appends" "only" "what" "changed" "so" "a" "save" "costs"
   "chunk" "not" "conversation" "while" "Emacs" "keeps" "streaming" "tokens"
   "from" "model" "and" "backend" "writes" "them" "to" "log" "fsyncs"
   "`code`" "(parens)" "\"quotes\"" "back\\slashes" "é" "ü" "漢字" "—"
   "dashes," "commas." "newlines\n"]
  "Words chunks are made of (the demo's).")

(defun msb-alloc-chunks (n)
  "Return a vector of N chunks the size a model streams (1 to 6 words)."
  (let ((state 42) (out (make-vector n nil)))
    (dotimes (i n)
      (let ((words (aref [1 1 1 2 2 3 4 6] (% (setq state (% (+ (* state 1103515245) 12345) 2147483648)) 8)))
            (text nil))
        (dotimes (_ words)
          (setq state (% (+ (* state 1103515245) 12345) 2147483648))
          (push (aref msb-alloc-words (% (/ state 7) (length msb-alloc-words))) text))
        (aset out i (concat (mapconcat #'identity text " ") " "))))
    out))

(defun msb-alloc-bytes (counts)
  "Return the bytes the `memory-use-counts' difference COUNTS stands for.
Object sizes are those `garbage-collect' reports on this Emacs."
  (let ((sizes (or (get 'msb-alloc-bytes 'sizes)
                   (put 'msb-alloc-bytes 'sizes
                        (let ((gc (garbage-collect)))
                          (mapcar (lambda (k) (or (nth 1 (assq k gc)) 0))
                                  '(conses floats vector-slots symbols
                                           string-bytes intervals strings)))))))
    (cl-loop for n in counts for size in sizes sum (* n size))))

(defvar msb-alloc--floor-process nil)
(defvar msb-alloc--floor-queue nil)
(defvar msb-alloc--floor-timer nil)

(defun msb-alloc--floor-tick ()
  "Send the queued chunks as one JSON line with one `process-send-string'."
  (setq msb-alloc--floor-timer nil)
  (when msb-alloc--floor-queue
    (process-send-string
     msb-alloc--floor-process
     (concat (json-serialize (vconcat (nreverse msb-alloc--floor-queue))) "\n"))
    (setq msb-alloc--floor-queue nil)))

(defun msb-alloc--floor-push (chunk)
  "Queue CHUNK and make sure a tick is scheduled (the floor's chunk path)."
  (push chunk msb-alloc--floor-queue)
  (unless msb-alloc--floor-timer
    (setq msb-alloc--floor-timer (run-at-time 0.25 nil #'msb-alloc--floor-tick))))

(defun msb-alloc--magent-p ()
  "Non-nil when upstream magent's ledger and session are loaded."
  (and (featurep 'magent-ledger) (featurep 'magent-session)))

(defun msb-alloc--noop-save (_session &optional _scope _delay)
  "A deferred save that does nothing (persistence off); conses nothing."
  nil)

(defun msb-alloc--events (sid)
  "Return the events that open a turn with one assistant item in SID."
  (let ((now (float-time)) (turn (concat sid "-turn")))
    `(((seq) (type . "thread-started") (thread-id . ,sid) (created-at . ,now))
      ((seq) (type . "turn-started") (thread-id . ,sid) (turn-id . ,turn)
       (payload (turn (id . ,turn) (thread-id . ,sid) (status . "in-progress")
                      (input . "Say something") (items . []) (queued-at . ,now)
                      (started-at . ,now)))
       (created-at . ,now))
      ((seq) (type . "item-started") (thread-id . ,sid) (turn-id . ,turn)
       (item-id . ,(concat sid "-item"))
       (payload (item (id . ,(concat sid "-item")) (turn-id . ,turn)
                      (type . "message") (status . "in-progress")
                      (role . "assistant") (created-at . ,now)
                      (updated-at . ,now)))
       (created-at . ,now)))))

(defun msb-alloc--pending-p (strategy sid)
  "Non-nil while STRATEGY still has a save of SID to make or answer."
  (pcase strategy
    ('store (let ((session (gethash sid magent-store--sessions)))
              (and session (or (magent-store--session-inflight session)
                               (magent-store--session-deadline session)))))
    ('log (and (boundp 'magent-session--save-timer) magent-session--save-timer))
    ('floor msb-alloc--floor-timer)))

(defun msb-alloc-run (strategy chunks rate &optional session-id root)
  "Stream CHUNKS (a vector of strings) at RATE per second under STRATEGY.
SESSION-ID names the store session (public API path; with upstream magent
the thread's id).  ROOT is the session root.  Return a plist: :bytes
:counts :chunks :cpu :wall :gcs :gc-seconds."
  (let* ((magent (msb-alloc--magent-p))
         (n (length chunks))
         (sid (or session-id (format "alloc-%s-%d" strategy (random 100000))))
         (thread (and magent (magent-thread-create :id sid :session-id sid)))
         (session (and magent (magent-session-create :id sid :thread thread)))
         (item-id (concat sid "-item"))
         item turn (i 0) (done nil) timer counts0 cpu0 wall0 gc0 gct0
         (saved-save (and magent (symbol-function
                                  'magent-session-save-deferred-for-session))))
    (when (and magent (eq strategy 'store)) (magent-store-mode 1))
    (when magent
      (magent-thread-start-turn thread (concat sid "-turn"))
      (setq turn (concat sid "-turn"))
      ;; magent records the prompt first; the title comes from it.
      (magent-thread-record-user-message-if-needed
       thread turn "Refactor the store so that a save costs the chunk")
      (setq item (magent-thread-start-item thread turn 'message
                                           :id (concat sid "-item")
                                           :role 'assistant))
      (when (eq strategy 'store)
        ;; The session is open before the stream, as after a turn's events.
        (magent-store-magent--open-thread thread)
        (magent-store-flush sid)))
    (unless magent
      (when (eq strategy 'store)
        (magent-store-open sid 'global)
        (dolist (event (msb-alloc--events sid))
          (magent-store-append-event sid event))
        (magent-store-flush sid)))
    (when (eq strategy 'floor)
      (unless (process-live-p msb-alloc--floor-process)
        (setq msb-alloc--floor-process
              (let ((process-connection-type nil))
                (start-process "msb-alloc-floor" nil "sh" "-c" "cat > /dev/null")))
        (set-process-query-on-exit-flag msb-alloc--floor-process nil)))
    (unwind-protect
        (progn
          (when (and magent (memq strategy '(none floor)))
            (fset 'magent-session-save-deferred-for-session #'msb-alloc--noop-save))
          (when root (setq magent-session-directory root))
          ;; Let whatever an earlier run left (a reply, a timer) happen first.
          (let ((end (+ (float-time) 0.5)))
            (while (< (float-time) end) (accept-process-output nil 0.05)))
          (garbage-collect)
          (setq counts0 (memory-use-counts) cpu0 (get-internal-run-time)
                wall0 (float-time) gc0 gcs-done gct0 gc-elapsed)
          (setq timer
                (run-at-time
                 0 (/ 1.0 rate)
                 (lambda ()
                   (if (>= i n)
                       (progn (cancel-timer timer) (setq done t))
                     (let ((chunk (aref chunks i)))
                       (cond
                        (magent
                         (magent-thread-append-item-content thread item chunk)
                         (when (eq strategy 'floor) (msb-alloc--floor-push chunk))
                         (magent-session-save-deferred-for-session session 'global))
                        ((eq strategy 'store)
                         (magent-store-append-item-content sid item-id chunk)
                         (magent-store-request-flush sid))
                        ((eq strategy 'floor) (msb-alloc--floor-push chunk))))
                     (setq i (1+ i))))))
          (while (not done) (accept-process-output nil 0.05))
          ;; The last save and its reply belong to this stream: wait for
          ;; them, and for no less than the same settling time in every
          ;; strategy, so that nothing of one run lands in the next.
          (let ((end (+ (float-time) 1.2))
                (limit (+ (float-time) 10)))
            (while (and (< (float-time) limit)
                        (or (< (float-time) end)
                            (msb-alloc--pending-p strategy sid)))
              (accept-process-output nil 0.05)))
          (let ((counts (cl-mapcar #'- (memory-use-counts) counts0)))
            (list :bytes (msb-alloc-bytes counts) :counts counts :chunks n
                  :cpu (float-time (time-subtract (get-internal-run-time) cpu0))
                  :wall (- (float-time) wall0)
                  :gcs (- gcs-done gc0) :gc-seconds (- gc-elapsed gct0))))
      (when saved-save
        (fset 'magent-session-save-deferred-for-session saved-save))
      (when (and magent (eq strategy 'store)) (magent-store-mode -1)))))

(provide 'msb-alloc)
;;; alloc.el ends here
