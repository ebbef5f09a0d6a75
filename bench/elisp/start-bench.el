;;; start-bench.el --- What a conversation's start costs Emacs, with magent-store-mode  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; One run of `make bench-start' (bench/start_bench.py), in a fresh
;; `emacs --batch' with upstream magent's code (MAGENT_LISP): turning the
;; mode on, the backend's start at the first idle moment (batch Emacs is
;; never idle: the run fires the mode's idle timer itself, then waits as
;; an idle Emacs does), magent's own saves, and a restart after the
;; backend is killed.  START_BENCH_SCENARIO says which:
;;
;; `ready': mode on; the backend started and waited for, with its parts
;;   (spawn, imports up to the port, connecting to the port, the token's
;;   round trip, the version check, a session's open); a new session's
;;   first save; a later save; then SIGKILL and the restart.
;; `first-save': mode on, the backend started, and at once a new
;;   session's turn saved: the first save of the day at its worst, the
;;   backend not yet ready.
;;
;; A turn's events and chunks come one after the other and the save
;; right after them, before Emacs has read any reply (the worst case);
;; START_BENCH_CHUNK_GAP=SECONDS has Emacs wait that long between chunks.
;;
;; "Blocked" is the time Emacs spent inside the shim's functions that run
;; from timers and process filters (and the mode's own call), summed: the
;; time Emacs could not answer the user.  Milliseconds, printed as one
;; line "START-BENCH <json>".

;;; Code:

(require 'cl-lib)
(require 'json)

(unless (locate-library "epc")
  (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path dir)))
(add-to-list 'load-path (getenv "MAGENT_LISP"))
;; magent requires gptel when it loads; these runs never call it.
(unless (locate-library "gptel")
  (add-to-list 'load-path (getenv "START_BENCH_STUBS") t))
(require 'magent-ledger)
(require 'magent-session)
(require 'magent-store)
(require 'magent-store-magent)

(defvar start-bench--blocked 0.0 "Seconds spent in the timed functions.")
(defvar start-bench--stamps nil "(NAME . TIME) pairs, newest first.")
(defvar start-bench--depth 0 "Nesting of timed functions (only the outer counts).")

(defun start-bench--stamp (name)
  "Note that NAME happened now."
  (push (cons name (float-time)) start-bench--stamps))

(defun start-bench--at (name)
  "Return when NAME first happened, or nil."
  (cdr (car (last (cl-remove-if-not (lambda (s) (eq (car s) name))
                                    start-bench--stamps)))))

(defun start-bench--timed (orig &rest args)
  "Call ORIG with ARGS, adding its time to the blocked time."
  (let ((start (float-time)))
    (cl-incf start-bench--depth)
    (unwind-protect (apply orig args)
      (cl-decf start-bench--depth)
      (when (= start-bench--depth 0)
        (cl-incf start-bench--blocked (- (float-time) start))))))

;; Everything of the shim that runs when Emacs is not inside a command of
;; the user's: the mode's start timer, the process filters and sentinels,
;; the recovery timer, the flush timer.
(dolist (f '(magent-store-magent--start-backend magent-store--server-output
             magent-store--filter magent-store--sentinel magent-store--recover
             magent-store--tick magent-store--retry))
  (advice-add f :around #'start-bench--timed))

(advice-add 'make-process :around
            (lambda (orig &rest args)
              (start-bench--stamp 'spawn-start)
              (prog1 (apply orig args) (start-bench--stamp 'spawned))))
(advice-add 'magent-store--server-output :before
            (lambda (&rest _) (unless (start-bench--at 'port) (start-bench--stamp 'port))))
(advice-add 'magent-store--connect :after
            (lambda (&rest _) (start-bench--stamp 'connected)))
(advice-add 'magent-store--check-version :around
            (lambda (orig &rest args)
              (start-bench--stamp 'auth-reply)
              (prog1 (apply orig args) (start-bench--stamp 'version-checked))))
(advice-add 'magent-store-send :around
            (lambda (orig method args &optional on-reply &rest rest)
              (let ((first (and (member method '("open" "prepare"))
                                (not (start-bench--at (intern (concat method "-sent")))))))
                (if first
                    (progn
                      (start-bench--stamp (intern (concat method "-sent")))
                      (apply orig method args
                             (lambda (value)
                               (start-bench--stamp (intern (concat method "-reply")))
                               (when on-reply (funcall on-reply value)))
                             rest))
                  (apply orig method args on-reply rest)))))

(defun start-bench--ms (from to)
  "Milliseconds between the stamps FROM and TO."
  (let ((a (start-bench--at from)) (b (start-bench--at to)))
    (and a b (* 1000 (- b a)))))

(defmacro start-bench--time (&rest body)
  "Run BODY; return its milliseconds."
  `(let ((start (float-time))) ,@body (* 1000 (- (float-time) start))))

(defun start-bench--wait-until (predicate)
  "Wait as an idle Emacs does (filters and timers run) until PREDICATE holds."
  (let ((deadline (+ (float-time) 30)))
    (while (and (not (funcall predicate)) (< (float-time) deadline))
      (accept-process-output nil 0.005))
    (unless (funcall predicate) (error "Timed out"))))

(defun start-bench--idle (seconds)
  "Let Emacs wait SECONDS as between two streamed chunks (filters and timers run)."
  (let ((until (+ (float-time) seconds)))
    (while (< (float-time) until)
      (accept-process-output nil (- until (float-time))))))

(defvar start-bench--chunk-gap (let ((gap (getenv "START_BENCH_CHUNK_GAP")))
                                 (and gap (string-to-number gap)))
  "Seconds Emacs waits between two streamed chunks; nil: none.
None by default: the save then comes right after the turn's first
events, before Emacs has read any reply to them (the worst case).")

(defun start-bench--turn (session text)
  "Play one completed turn of SESSION answering TEXT, as magent does.
The answer streams in chunks `start-bench--chunk-gap' apart."
  (let* ((thread (magent-session-thread-ledger session))
         (turn-id (magent-thread-turn-id
                   (magent-thread-create-turn thread "hello" nil
                                              (list :source 'agent-run-turn))))
         (item (magent-thread-start-item thread turn-id 'message :role 'assistant)))
    (magent-thread-record-user-message-if-needed
     thread turn-id "hello" nil (list :source 'agent-run-turn))
    (magent-session-save-deferred-for-session session 'global)
    (dolist (chunk (list "The " "answer " text))
      (when start-bench--chunk-gap (start-bench--idle start-bench--chunk-gap))
      (magent-thread-append-item-content thread item chunk)
      (magent-session-save-deferred-for-session session 'global))
    (magent-thread-complete-item thread item :content (concat "The answer " text))
    (magent-thread-complete-turn thread turn-id nil)))

(defun start-bench--save (id text)
  "Play a turn of session ID and time magent's synchronous save (ms)."
  (let ((session (or (magent-session-get-id-session id)
                     (magent-session-create :id id)))
        (magent-session--current-scope 'global))
    (start-bench--turn session text)
    (start-bench--time (magent-session-save-for-session session 'global))))

(defvar start-bench--sessions (make-hash-table :test #'equal))
(defun magent-session-get-id-session (id)
  "The bench's session ID, or nil."
  (gethash id start-bench--sessions))
(advice-add 'magent-session-create :filter-return
            (lambda (session)
              (puthash (magent-session-get-id session) session start-bench--sessions)
              session))

(defun start-bench--start ()
  "Turn the mode on and fire its start timer as the first idle moment would."
  (let* ((mode-on (start-bench--time (magent-store-mode 1)))
         (timer (bound-and-true-p magent-store-magent--start-timer)))
    (setq start-bench--blocked (/ mode-on 1000.0))
    (start-bench--stamp 'idle)
    (if timer
        (timer-event-handler timer)
      ;; A shim from before the mode started the backend (--elisp): as
      ;; its first event would.
      (start-bench--timed #'magent-store-ensure-backend))
    mode-on))

(defun start-bench-run ()
  "Run START_BENCH_SCENARIO and print its figures."
  (let* ((root (make-temp-file "start-bench-" t))
         (magent-session-directory (expand-file-name "sessions" root))
         (magent-store-python (getenv "START_BENCH_BACKEND"))
         (process-environment (cons (concat "XDG_STATE_HOME=" root "/state")
                                    process-environment))
         (result nil))
    (unwind-protect
        (pcase (getenv "START_BENCH_SCENARIO")
          ("ready"
           (let ((mode-on (start-bench--start)))
             (start-bench--wait-until (lambda () (magent-store-ready-p magent-store-current-backend)))
             (start-bench--stamp 'ready)
             (let ((blocked (* 1000 start-bench--blocked))
                   (wall (start-bench--ms 'idle 'ready)))
               ;; The root's store, made behind the ready backend (a shim
               ;; from before it made none): a user's first save comes later.
               (when (start-bench--at 'prepare-sent)
                 (start-bench--wait-until (lambda () (start-bench--at 'prepare-reply))))
               (let ((first (start-bench--save "s-new" "one")))
               (setq result
                     `((mode-on . ,mode-on) (ready . ,wall) (ready-blocked . ,blocked)
                       (spawn . ,(start-bench--ms 'spawn-start 'spawned))
                       (imports . ,(start-bench--ms 'spawned 'port))
                       (port . ,(start-bench--ms 'port 'connected))
                       (auth . ,(start-bench--ms 'connected 'auth-reply))
                       (version . ,(start-bench--ms 'auth-reply 'version-checked))
                       (prepared . ,(start-bench--ms 'prepare-sent 'prepare-reply))
                       (open . ,(start-bench--ms 'open-sent 'open-reply))
                       (first-session-first-save . ,first)
                       (later-save . ,(start-bench--save "s-new" "two"))
                       (new-session-first-save . ,(start-bench--save "s-other" "three"))))))
             ;; A crash: the backend killed, restarted by the shim.
             (let ((old magent-store-current-backend))
               (start-bench--wait-until (lambda () (magent-store-ready-p old)))
               (setq start-bench--blocked 0.0)
               (let ((killed (float-time)))
                 (signal-process (magent-store-backend-pid old) 'SIGKILL)
                 (start-bench--wait-until
                  (lambda () (and magent-store-current-backend
                                  (not (eq old magent-store-current-backend))
                                  (magent-store-ready-p magent-store-current-backend)
                                  (not magent-store-recovering))))
                 (push `(restart . ,(* 1000 (- (float-time) killed))) result)
                 (push `(restart-blocked . ,(* 1000 start-bench--blocked)) result)))))
          ("first-save"
           (let* ((mode-on (start-bench--start))
                  (ready-before (magent-store-ready-p magent-store-current-backend))
                  (save (start-bench--save "s-first" "one")))
             (when ready-before (error "The backend was ready before the save"))
             (setq result `((mode-on . ,mode-on) (first-save-of-the-day . ,save)
                            (first-save-blocked . ,(+ save (* 1000 start-bench--blocked))))))))
      (ignore-errors (magent-store-stop))
      (delete-directory root t))
    (when magent-store-magent--adapter-failures
      (error "The adapter failed: %S" magent-store-magent--adapter-failures))
    (message "START-BENCH %s" (json-encode result))))

(provide 'start-bench)
;;; start-bench.el ends here
