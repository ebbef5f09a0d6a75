;;; strategies.el --- Persistence strategies measured by bench/emacs_bench.py  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Benchmark code, not product code.  Three ways for Emacs to persist a
;; streaming magent session, driven over identical sessions and streams:
;;
;; - `full': schema-6 saving as magent did it: the whole session (header,
;;   materialized snapshot, bounded journal) turned into an alist, encoded
;;   with `json-encode' (or `json-serialize'), written to a temp file with
;;   `write-region' and renamed over the target.
;; - `log': schema-7 saving in Elisp as magent's design describes it: encode only
;;   the events not yet in the log, append them with `write-region', write
;;   the header only when its text changed, rewrite the snapshot only when
;;   the log passes its bound.
;; - `store': the magent-store shim and backend as shipped.
;; - `floor': no persistence logic at all: the chunks of one tick sent
;;   as one JSON line with one bare `process-send-string' to a pipe.
;; - `none': the same stream with persistence off (the baseline).
;;
;; Every strategy does the same in-memory work magent does (apply the
;; event to the thread, keep it in the journal); only persistence differs.
;; The stream runs from a repeating timer while the daemon's command loop
;; waits for input, as process output would arrive: idle timers behave as
;; in an interactive Emacs.  Results go to a JSON file the driver polls.

;;; Code:

(require 'cl-lib)
(require 'json)
(require 'subr-x)

;;;; The in-memory thread (magent's own work, the same in every strategy)

(cl-defstruct (msb-thread (:constructor msb-thread-make) (:copier nil))
  id session-id scope status created-at updated-at preview metadata
  turns (last-seq 0) journal (journal-length 0) items header
  (persisted-seq 0) (log-count 0) last-header file)

(cl-defstruct (msb-turn (:constructor msb-turn-make) (:copier nil))
  id thread-id op-id status input items error usage metadata
  queued-at started-at completed-at duration-ms)

(cl-defstruct (msb-item (:constructor msb-item-make) (:copier nil))
  id turn-id type status role content name call-id input output error
  phase metadata created-at updated-at completed-at)

(defconst msb-journal-max 2000
  "Events a schema-6 file keeps in its journal; also the log bound.")

(defun msb--get (alist key)
  "Return KEY of ALIST."
  (cdr (assq key alist)))

(defun msb--item-from-alist (a)
  "Return an item struct from alist A."
  (msb-item-make
   :id (msb--get a 'id) :turn-id (msb--get a 'turn-id) :type (msb--get a 'type)
   :status (msb--get a 'status) :role (msb--get a 'role)
   :content (msb--get a 'content) :name (msb--get a 'name)
   :call-id (msb--get a 'call-id) :input (msb--get a 'input)
   :output (msb--get a 'output) :error (msb--get a 'error)
   :phase (msb--get a 'phase) :metadata (msb--get a 'metadata)
   :created-at (msb--get a 'created-at) :updated-at (msb--get a 'updated-at)
   :completed-at (msb--get a 'completed-at)))

(defun msb--turn-from-alist (a)
  "Return a turn struct from alist A (its items converted too)."
  (msb-turn-make
   :id (msb--get a 'id) :thread-id (msb--get a 'thread-id)
   :op-id (msb--get a 'op-id) :status (msb--get a 'status)
   :input (msb--get a 'input)
   :items (mapcar #'msb--item-from-alist (msb--get a 'items))
   :error (msb--get a 'error) :usage (msb--get a 'usage)
   :metadata (msb--get a 'metadata) :queued-at (msb--get a 'queued-at)
   :started-at (msb--get a 'started-at)
   :completed-at (msb--get a 'completed-at)
   :duration-ms (msb--get a 'duration-ms)))

(defun msb-load-schema6 (file)
  "Read the schema-6 session FILE into an `msb-thread'."
  (let* ((data (with-temp-buffer
                 (let ((coding-system-for-read 'utf-8-unix))
                   (insert-file-contents file))
                 (json-parse-buffer :object-type 'alist :array-type 'list
                                    :null-object nil :false-object :json-false)))
         (snap (msb--get data 'snapshot))
         (journal (reverse (msb--get data 'journal)))
         (thread (msb-thread-make
                  :id (msb--get snap 'id) :session-id (msb--get snap 'session-id)
                  :scope (msb--get snap 'scope) :status (msb--get snap 'status)
                  :created-at (msb--get snap 'created-at)
                  :updated-at (msb--get snap 'updated-at)
                  :preview (msb--get snap 'preview)
                  :metadata (msb--get snap 'metadata)
                  :turns (mapcar #'msb--turn-from-alist (msb--get snap 'turns))
                  :last-seq (or (msb--get snap 'last-event-seq) 0)
                  :journal journal :journal-length (length journal)
                  :items (make-hash-table :test #'equal)
                  :header (cl-remove-if (lambda (cell)
                                          (memq (car cell) '(snapshot journal)))
                                        data))))
    (dolist (turn (msb-thread-turns thread))
      (dolist (item (msb-turn-items turn))
        (puthash (msb-item-id item) item (msb-thread-items thread))))
    (when journal
      (setf (msb-thread-last-seq thread)
            (max (msb-thread-last-seq thread) (msb--get (car journal) 'seq))))
    thread))

(defun msb--find-turn (thread id)
  "Return the turn ID of THREAD (the newest are searched first)."
  (cl-find id (msb-thread-turns thread) :key #'msb-turn-id :test #'equal
           :from-end t))

(defun msb-record (thread event)
  "Give EVENT (an alist, consumed) the next seq of THREAD and journal it."
  (let ((seq (cl-incf (msb-thread-last-seq thread))))
    (setcdr (assq 'seq event) seq)
    (push event (msb-thread-journal thread))
    (cl-incf (msb-thread-journal-length thread))
    ;; Keep the journal bounded as magent does, without walking it per event.
    (when (> (msb-thread-journal-length thread) (* 2 msb-journal-max))
      (setcdr (nthcdr (1- msb-journal-max) (msb-thread-journal thread)) nil)
      (setf (msb-thread-journal-length thread) msb-journal-max))
    event))

(defun msb-apply-event (thread event)
  "Apply EVENT (an alist, as the script gives it) to THREAD and journal it."
  (let* ((type (msb--get event 'type))
         (now (float-time))
         (payload (msb--get event 'payload)))
    (pcase type
      ("turn-started"
       (let ((turn (msb--turn-from-alist (msb--get payload 'turn))))
         (setf (msb-turn-status turn) "in-progress")
         (setf (msb-thread-turns thread)
               (nconc (msb-thread-turns thread) (list turn))
               (msb-thread-status thread) "active")))
      ("item-started"
       (let ((turn (msb--find-turn thread (msb--get event 'turn-id)))
             (item (msb--item-from-alist (msb--get payload 'item))))
         (when turn
           (setf (msb-item-status item) "in-progress")
           (setf (msb-turn-items turn) (nconc (msb-turn-items turn) (list item)))
           (puthash (msb-item-id item) item (msb-thread-items thread)))))
      ("item-completed"
       (let ((item (gethash (msb--get event 'item-id) (msb-thread-items thread))))
         (when item
           (setf (msb-item-status item) "completed"
                 (msb-item-completed-at item) now (msb-item-updated-at item) now))))
      ("turn-completed"
       (let ((turn (msb--find-turn thread (msb--get event 'turn-id))))
         (when turn
           (setf (msb-turn-status turn) "completed" (msb-turn-completed-at turn) now
                 (msb-turn-usage turn) (msb--get payload 'usage))
           (setf (msb-thread-status thread) "idle")))))
    (setf (msb-thread-updated-at thread) now)
    (msb-record thread (copy-sequence event))))

(defun msb-apply-chunk (thread item-id chunk output)
  "Append CHUNK to ITEM-ID's content (OUTPUT non-nil: its output) in THREAD."
  (let ((item (gethash item-id (msb-thread-items thread)))
        (now (float-time)))
    (when item
      (if output
          (setf (msb-item-output item) (concat (msb-item-output item) chunk))
        (setf (msb-item-content item) (concat (msb-item-content item) chunk)))
      (setf (msb-item-updated-at item) now (msb-thread-updated-at thread) now)
      (msb-record thread
                  (list (cons 'seq nil) (cons 'type "item-content-appended")
                        (cons 'thread-id (msb-thread-id thread))
                        (cons 'turn-id (msb-item-turn-id item))
                        (cons 'item-id item-id)
                        (cons 'payload (list (cons 'chunk chunk)
                                             (cons 'output (if output t :json-false))))
                        (cons 'created-at now))))))

;;;; Traversal: the thread as the alists a save encodes

(defun msb-item-to-alist (item)
  "Return ITEM as an alist."
  `((id . ,(msb-item-id item)) (turn-id . ,(msb-item-turn-id item))
    (type . ,(msb-item-type item)) (status . ,(msb-item-status item))
    (role . ,(msb-item-role item)) (content . ,(msb-item-content item))
    (name . ,(msb-item-name item)) (call-id . ,(msb-item-call-id item))
    (input . ,(msb-item-input item)) (output . ,(msb-item-output item))
    (error . ,(msb-item-error item)) (phase . ,(msb-item-phase item))
    (metadata . ,(msb-item-metadata item))
    (created-at . ,(msb-item-created-at item))
    (updated-at . ,(msb-item-updated-at item))
    (completed-at . ,(msb-item-completed-at item))))

(defun msb-turn-to-alist (turn)
  "Return TURN as an alist."
  `((id . ,(msb-turn-id turn)) (thread-id . ,(msb-turn-thread-id turn))
    (op-id . ,(msb-turn-op-id turn)) (status . ,(msb-turn-status turn))
    (input . ,(msb-turn-input turn))
    (items . ,(vconcat (mapcar #'msb-item-to-alist (msb-turn-items turn))))
    (error . ,(msb-turn-error turn)) (usage . ,(msb-turn-usage turn))
    (metadata . ,(msb-turn-metadata turn))
    (queued-at . ,(msb-turn-queued-at turn))
    (started-at . ,(msb-turn-started-at turn))
    (completed-at . ,(msb-turn-completed-at turn))
    (duration-ms . ,(msb-turn-duration-ms turn))))

(defun msb-snapshot-to-alist (thread)
  "Return THREAD's materialized snapshot as an alist."
  `((id . ,(msb-thread-id thread)) (session-id . ,(msb-thread-session-id thread))
    (scope . ,(msb-thread-scope thread)) (status . ,(msb-thread-status thread))
    (created-at . ,(msb-thread-created-at thread))
    (updated-at . ,(msb-thread-updated-at thread))
    (preview . ,(msb-thread-preview thread))
    (metadata . ,(msb-thread-metadata thread))
    (turns . ,(vconcat (mapcar #'msb-turn-to-alist (msb-thread-turns thread))))
    (snapshot-created-at . ,(float-time))
    (last-event-seq . ,(msb-thread-last-seq thread))))

(defun msb-journal-vector (thread)
  "Return THREAD's journal tail (oldest first) as a vector."
  (let ((tail (seq-take (msb-thread-journal thread) msb-journal-max)))
    (vconcat (reverse tail))))

(defun msb-schema6-alist (thread)
  "Return the whole schema-6 file of THREAD as an alist (the traversal)."
  (append (msb-thread-header thread)
          `((snapshot . ,(msb-snapshot-to-alist thread))
            (journal . ,(msb-journal-vector thread)))))

;;;; Strategy `full': schema-6 full rewrite

(defvar msb-encoder 'json-encode
  "Encoder of the full rewrite: `json-encode' or `json-serialize'.")

(defun msb--encode (object)
  "Encode OBJECT with `msb-encoder'."
  (if (eq msb-encoder 'json-serialize)
      (json-serialize object :null-object nil :false-object :json-false)
    (json-encode object)))

(defun msb--write-atomic (text file)
  "Write TEXT to FILE atomically: a temp file in its directory, renamed."
  (let ((tmp (make-temp-file (expand-file-name
                              (concat "." (file-name-nondirectory file) "-")
                              (file-name-directory file))))
        (coding-system-for-write 'utf-8-unix))
    (write-region text nil tmp nil 'silent)
    (rename-file tmp file t)))

(defvar msb-attribution nil
  "When non-nil, `msb-full-save' sets this to its phase times.
The list is (TRAVERSE ENCODE WRITE BYTES).")

(defun msb-full-save (thread)
  "Save THREAD the schema-6 way: encode everything, write, rename."
  (let* ((t0 (float-time))
         (data (msb-schema6-alist thread))
         (t1 (float-time))
         (text (msb--encode data))
         (t2 (float-time)))
    (msb--write-atomic text (msb-thread-file thread))
    (when msb-attribution
      (let ((t3 (float-time)))
        (setq msb-attribution (list (- t1 t0) (- t2 t1) (- t3 t2)
                                    (string-bytes text)))))))

;;;; Strategy `log': schema-7 append log in Elisp

(defun msb-log-header-file (thread)
  "Return THREAD's header file."
  (msb-thread-file thread))

(defun msb-log-save (thread)
  "Save THREAD the schema-7 way: append the new events, header if changed."
  (let* ((file (msb-thread-file thread))
         (base (file-name-sans-extension file))
         (since (msb-thread-persisted-seq thread))
         (new nil))
    ;; The events not yet in the log: the newest part of the journal.
    (cl-loop for event in (msb-thread-journal thread)
             while (> (msb--get event 'seq) since)
             do (push event new))
    (when new
      (with-temp-buffer
        (dolist (event new)
          (insert (json-encode event) "\n"))
        (let ((coding-system-for-write 'utf-8-unix))
          (write-region nil nil (concat base ".jsonl") t 'silent)))
      (setf (msb-thread-persisted-seq thread) (msb-thread-last-seq thread))
      (cl-incf (msb-thread-log-count thread) (length new)))
    (let ((header (json-encode (append (msb-thread-header thread)
                                       '((schema-version . 7))))))
      (unless (equal header (msb-thread-last-header thread))
        (msb--write-atomic header file)
        (setf (msb-thread-last-header thread) header)))
    (when (> (msb-thread-log-count thread) msb-journal-max)
      ;; Compaction: the snapshot first, then the log cut to a tail.
      (msb--write-atomic (json-encode (msb-snapshot-to-alist thread))
                         (concat base ".snapshot"))
      (with-temp-buffer
        (dolist (event (reverse (seq-take (msb-thread-journal thread) 100)))
          (insert (json-encode event) "\n"))
        (let ((coding-system-for-write 'utf-8-unix))
          (write-region nil nil (concat base ".jsonl") nil 'silent)))
      (setf (msb-thread-log-count thread) 0))))

;;;; Save scheduling: idle timer (magent before) or elapsed-time timer

(defvar msb-timer-kind 'elapsed
  "How saves are scheduled: `idle' or `elapsed'.")

(defvar msb-interval 0.25
  "Delay of a save request, in seconds.")

(defvar msb--save-timer nil)
(defvar msb--save-function nil)
(defvar msb--thread nil)
(defvar msb-saves 0)

(defun msb-fire ()
  "Run the scheduled save."
  (setq msb--save-timer nil)
  (cl-incf msb-saves)
  (funcall msb--save-function msb--thread))

(defun msb-request-save ()
  "Ask for a save; requests coalesce behind the scheduled one."
  (unless msb--save-timer
    (setq msb--save-timer
          (if (eq msb-timer-kind 'idle)
              (run-with-idle-timer msb-interval nil #'msb-fire)
            (run-at-time msb-interval nil #'msb-fire)))))

;;;; Strategy `floor': a bare send per tick

(defvar msb--floor-process nil)
(defvar msb--floor-queue nil)

(defun msb-floor-push (chunk)
  "Queue CHUNK for the next tick."
  (push chunk msb--floor-queue))

(defun msb-floor-save (_thread)
  "Send the queued chunks as one JSON line with one `process-send-string'."
  (when msb--floor-queue
    (process-send-string
     msb--floor-process
     (concat (json-serialize (vconcat (nreverse msb--floor-queue))) "\n"))
    (setq msb--floor-queue nil)))

(defun msb-floor-process ()
  "Return a live pipe to cat > /dev/null."
  (unless (process-live-p msb--floor-process)
    (setq msb--floor-process
          (let ((process-connection-type nil))
            (start-process "msb-floor" nil "sh" "-c" "cat > /dev/null")))
    (set-process-query-on-exit-flag msb--floor-process nil))
  msb--floor-process)

;;;; Per-call timing (the timed run only)

(defvar msb--calls nil
  "Per function: (NAME TOTAL MAX COUNT GCS MAX-OWN MAX-GC).
MAX-OWN is the longest call without the garbage collection that ran
inside it, MAX-GC the longest collection inside one call.  A timed
function called from another (the shim's tick from its chunk path)
counts as NAME/nested, which totals leave out: no time counts twice.")

(defvar msb--depth 0
  "How many timed calls are running.")

(defun msb--timer-advice (name)
  "Return :around advice timing calls of NAME."
  (let ((nested (intern (format "%s/nested" name))))
    (lambda (orig &rest args)
      (let ((start (float-time)) (gcs gcs-done) (gc-start gc-elapsed)
            (key (if (> msb--depth 0) nested name)))
        (prog1 (let ((msb--depth (1+ msb--depth))) (apply orig args))
          (let* ((spent (- (float-time) start))
                 (in-gc (- gc-elapsed gc-start))
                 (cell (or (assq key msb--calls)
                           (car (push (list key 0.0 0.0 0 0 0.0 0.0)
                                      msb--calls)))))
            (setf (nth 1 cell) (+ (nth 1 cell) spent)
                  (nth 2 cell) (max (nth 2 cell) spent)
                  (nth 3 cell) (1+ (nth 3 cell))
                  (nth 4 cell) (+ (nth 4 cell) (- gcs-done gcs))
                  (nth 5 cell) (max (nth 5 cell) (- spent in-gc))
                  (nth 6 cell) (max (nth 6 cell) in-gc))))))))

(defun msb--noop (&rest _)
  "Do nothing (for calibrating the timing advice)."
  nil)

(defun msb-calibrate (n)
  "Return the seconds the timing advice adds to one call (N calls measured)."
  (let ((msb--calls nil) t0 bare advised)
    (setq t0 (float-time))
    (dotimes (_ n) (msb--noop 1 2))
    (setq bare (- (float-time) t0))
    (advice-add 'msb--noop :around (msb--timer-advice 'msb--noop)
                '((name . msb-timed)))
    (setq t0 (float-time))
    (dotimes (_ n) (msb--noop 1 2))
    (setq advised (- (float-time) t0))
    (advice-remove 'msb--noop 'msb-timed)
    (/ (- advised bare) n)))

(defconst msb-timed-functions
  '((full msb-fire msb-request-save)
    (log msb-fire msb-request-save)
    (floor msb-fire msb-request-save msb-floor-push)
    (store magent-store-append-event magent-store-append-item-content
           magent-store-request-flush magent-store--tick magent-store--filter)
    (none))
  "The persistence entry points of each strategy.")

;;;; The stream

(defun msb-read-script (file suffix)
  "Read the stream script FILE, item and turn ids given SUFFIX."
  (let ((script (with-temp-buffer
                  (let ((coding-system-for-read 'utf-8-unix))
                    (insert-file-contents file))
                  (json-parse-buffer :object-type 'alist :array-type 'array
                                     :null-object nil :false-object nil))))
    (cl-map 'vector
            (lambda (entry)
              (let ((event (msb--get entry 'event))
                    (chunk (msb--get entry 'chunk)))
                (if event
                    (let ((event (copy-tree event)))
                      (dolist (key '(turn-id item-id))
                        (when (msb--get event key)
                          (setcdr (assq key event)
                                  (concat (msb--get event key) suffix))))
                      (dolist (key '(turn item))
                        (let ((obj (msb--get (msb--get event 'payload) key)))
                          (when obj
                            (setcdr (assq 'id obj) (concat (msb--get obj 'id) suffix))
                            (when (assq 'turn-id obj)
                              (setcdr (assq 'turn-id obj)
                                      (concat (msb--get obj 'turn-id) suffix))))))
                      (list 'event event))
                  (list 'chunk (concat (aref chunk 0) suffix) (aref chunk 1)
                        (aref chunk 2)))))
            script)))

(defvar msb--run-counter 0)

(defun msb-run (spec)
  "Start one stream described by the plist SPEC; return immediately.
Keys: :strategy :thread-var :session-id :script :rate :interval :timer
:encoder :instrument :result :file.  The result JSON goes to :result."
  (let* ((strategy (plist-get spec :strategy))
         (thread (symbol-value (plist-get spec :thread-var)))
         (script (msb-read-script (plist-get spec :script)
                                  (format "-r%d" (cl-incf msb--run-counter))))
         (n (length script))
         (rate (plist-get spec :rate))
         (sid (plist-get spec :session-id))
         (instrument (plist-get spec :instrument))
         (session (and (eq strategy 'store)
                       (gethash sid magent-store--sessions)))
         (flushes0 (if session (magent-store--session-flushes session) 0))
         (i 0) timer cpu0 wall0 gc0 gct0)
    (setq msb-interval (or (plist-get spec :interval) 0.25)
          msb-timer-kind (or (plist-get spec :timer) 'elapsed)
          msb-encoder (or (plist-get spec :encoder) 'json-encode)
          msb--thread thread msb-saves 0 msb--calls nil msb--save-timer nil
          msb--save-function (pcase strategy
                               ('full #'msb-full-save) ('log #'msb-log-save)
                               ('floor #'msb-floor-save) (_ #'ignore))
          magent-store-persistence-enabled (eq strategy 'store))
    (setf (msb-thread-file thread) (plist-get spec :file)
          (msb-thread-persisted-seq thread) (msb-thread-last-seq thread)
          (msb-thread-log-count thread) 0
          (msb-thread-last-header thread) nil)
    (when (eq strategy 'floor) (msb-floor-process))
    (when instrument
      (dolist (f (cdr (assq strategy msb-timed-functions)))
        (advice-add f :around (msb--timer-advice f) '((name . msb-timed)))))
    (garbage-collect)
    (setq cpu0 (get-internal-run-time) wall0 (float-time)
          gc0 gcs-done gct0 gc-elapsed)
    (setq timer
          (run-at-time
           0 (/ 1.0 rate)
           (lambda ()
             ;; Events go out with the chunk that follows them, as magent's do.
             (let ((sent nil))
               (while (and (< i n) (not sent))
                 (let ((entry (aref script i)))
                   (if (eq (car entry) 'event)
                       (let ((event (nth 1 entry)))
                         (msb-apply-event thread event)
                         (when (eq strategy 'store)
                           (magent-store-append-event sid event)))
                     (let ((item (nth 1 entry)) (chunk (nth 2 entry))
                           (output (nth 3 entry)))
                       (msb-apply-chunk thread item chunk output)
                       (pcase strategy
                         ('store (magent-store-append-item-content
                                  sid item chunk output))
                         ('floor (msb-floor-push chunk)))
                       (setq sent t)))
                   (pcase strategy
                     ('store (magent-store-request-flush sid))
                     ((or 'full 'log 'floor) (msb-request-save)))
                   (setq i (1+ i)))))
             (when (>= i n)
               (cancel-timer timer)
               ;; Let the last save (and its reply) happen, as in a session.
               (run-at-time (+ 0.1 (* 2 msb-interval)) nil #'msb--finish
                            (list :spec spec :cpu0 cpu0 :wall0 wall0
                                  :late (float-time) :gc0 gc0 :gct0 gct0
                                  :entries n :session session
                                  :flushes0 flushes0
                                  :chunks (cl-count 'chunk script :key #'car)))))))
    t))

(defun msb--finish (state)
  "Write the report of the stream whose STATE is a plist."
  (let* ((spec (plist-get state :spec))
         (strategy (plist-get spec :strategy))
         (session (plist-get state :session))
         (cpu (float-time (time-subtract (get-internal-run-time)
                                         (plist-get state :cpu0))))
         (wall0 (plist-get state :wall0))
         (wall (- (float-time) wall0)))
    (dolist (f (cdr (assq strategy msb-timed-functions)))
      (advice-remove f 'msb-timed))
    (msb--write-result
     (plist-get spec :result)
     `((cpu . ,cpu) (wall . ,wall)
       (stream-wall . ,(- (plist-get state :late) wall0))
       (entries . ,(plist-get state :entries))
       (chunks . ,(plist-get state :chunks))
       (gcs . ,(- gcs-done (plist-get state :gc0)))
       (gc-seconds . ,(- gc-elapsed (plist-get state :gct0)))
       (saves . ,(if session
                     (- (magent-store--session-flushes session)
                        (plist-get state :flushes0))
                   msb-saves))
       (functions
        . ,(vconcat
            (mapcar (lambda (c)
                      (vector (symbol-name (car c)) (nth 1 c)
                              (nth 2 c) (nth 3 c) (nth 4 c)
                              (nth 5 c) (nth 6 c)))
                    msb--calls)))))))

(defun msb--write-result (file alist)
  "Write ALIST as JSON to FILE (atomically: the driver polls for it)."
  (let ((tmp (concat file ".tmp")))
    (with-temp-file tmp
      (insert (json-serialize alist)))
    (rename-file tmp file t)))

;;;; One-off measurements

(defun msb-attribute (thread file repeats)
  "Time REPEATS full saves of THREAD to FILE per phase; return an alist."
  (setf (msb-thread-file thread) file)
  (let (rows)
    (dolist (encoder '(json-encode json-serialize))
      (let ((msb-encoder encoder) (runs nil))
        (dotimes (_ repeats)
          (garbage-collect)
          (let ((msb-attribution t) (gc0 gc-elapsed) (t0 (float-time)))
            (msb-full-save thread)
            (push (append msb-attribution (list (- (float-time) t0)
                                                (- gc-elapsed gc0)))
                  runs)))
        (push (cons encoder runs) rows)))
    rows))

(defun msb-cost-of-save (thread file strategy repeats)
  "Time REPEATS saves of THREAD by STRATEGY after one chunk each."
  (setf (msb-thread-file thread) file
        (msb-thread-persisted-seq thread) (msb-thread-last-seq thread)
        (msb-thread-last-header thread) nil)
  (let ((item (car (last (msb-turn-items (car (last (msb-thread-turns thread)))))))
        times)
    (dotimes (_ repeats)
      (msb-apply-chunk thread (msb-item-id item) "one more chunk " nil)
      (let ((t0 (float-time)))
        (pcase strategy
          ('full (msb-full-save thread))
          ('log (msb-log-save thread)))
        (push (- (float-time) t0) times)))
    times))

(provide 'msb-strategies)
;;; strategies.el ends here
