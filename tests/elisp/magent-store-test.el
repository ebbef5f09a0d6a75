;;; magent-store-test.el --- Helpers of the magent-store ERT tests  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; What the ERT suites share: a real backend per test (no mocks), with a
;; fresh session root and state directory, started by the shim exactly as
;; a user's Emacs starts it; and events in magent's shape.  `make
;; test-elisp' sets `magent-store-test-python' to the checkout's
;; .venv/bin/magent-store.

;;; Code:

(require 'cl-lib)
(require 'ert)

(require 'magent-store-test-backend)
(require 'magent-store)

(defmacro magent-store-test--with-backend (&rest body)
  "Run BODY with a private root and state dir; stop the backend after.
See `magent-store-test-with-backend'."
  (declare (indent 0) (debug t))
  `(magent-store-test-with-backend () ,@body))

;;;; A backend that does not answer

(defun magent-store-test--stopped-p (pid)
  "Return non-nil when every thread of process PID is stopped."
  (let ((tasks (directory-files (format "/proc/%d/task" pid) t "\\`[0-9]+\\'")))
    (and tasks
         (cl-every (lambda (task)
                     (with-temp-buffer
                       (ignore-errors
                         (insert-file-contents (expand-file-name "status" task)))
                       (re-search-forward "^State:[ \t]+[tT]" nil t)))
                   tasks))))

(defun magent-store-test--pause (pid)
  "Stop the backend of PID (SIGSTOP); return once every thread of it stopped.
A thread inside a call the kernel does not interrupt (an fsync, say)
stops only when that call returns, and the others answer meanwhile:
the backend does not answer only from then on.  Nothing of the code
under test runs while this waits (no timer, no other process's output)."
  (signal-process pid 'SIGSTOP)
  (let ((deadline (+ (float-time) 30))
        (connection (and magent-store-current-backend
                         (magent-store-backend-connection magent-store-current-backend))))
    (while (not (magent-store-test--stopped-p pid))
      (when (> (float-time) deadline)
        (error "The backend (pid %s) did not stop within 30 s" pid))
      (if (process-live-p connection)
          (accept-process-output connection 0.02 nil 1)
        (sleep-for 0.02)))))

;;;; Events in magent's shape

(defun magent-store-test--event (type &rest fields)
  "Return a journal event alist of TYPE with FIELDS (a plist)."
  `((seq) (type . ,type) (thread-id . "thread-1")
    (turn-id . ,(plist-get fields :turn-id))
    (item-id . ,(plist-get fields :item-id))
    (payload . ,(plist-get fields :payload))
    (created-at . ,(float-time))))

(defun magent-store-test--item (id turn-id &optional role type)
  "Return an item alist ID in TURN-ID with ROLE and TYPE."
  `((id . ,id) (turn-id . ,turn-id) (type . ,(or type "message"))
    (status . "in-progress") (role . ,(or role "assistant")) (content) (name)
    (call-id) (input) (output) (error) (phase) (metadata)
    (created-at . ,(float-time)) (updated-at . ,(float-time)) (completed-at)))

(defun magent-store-test--turn (id)
  "Return a turn alist ID."
  `((id . ,id) (thread-id . "thread-1") (op-id) (status . "in-progress")
    (input . "Say something") (items . []) (error) (usage) (metadata)
    (queued-at . ,(float-time)) (started-at . ,(float-time)) (completed-at)
    (duration-ms)))

(defun magent-store-test--start-turn (session-id)
  "Journal a thread, a turn and an assistant item in SESSION-ID."
  (magent-store-append-event session-id
                             (magent-store-test--event "thread-started"))
  (magent-store-append-event
   session-id (magent-store-test--event
               "turn-started" :turn-id "turn-1"
               :payload `((turn . ,(magent-store-test--turn "turn-1")))))
  (magent-store-append-event
   session-id (magent-store-test--event
               "item-started" :turn-id "turn-1" :item-id "item-1"
               :payload `((item . ,(magent-store-test--item "item-1" "turn-1"))))))

(defun magent-store-test--session (session-id)
  "Open SESSION-ID, journal a turn in it and flush; return the session."
  (magent-store-open session-id)
  (magent-store-test--start-turn session-id)
  (magent-store-flush session-id)
  (gethash session-id magent-store--sessions))

(defconst magent-store-test--chunks
  (let (chunks)
    (dotimes (i 40)
      (push (format "chunk %d: \"quoted\" back\\slash é 漢字 \u2028 newline\n" i)
            chunks))
    (nreverse chunks))
  "Chunks with everything that has broken serializers before.")

(defun magent-store-test--content (loaded)
  "Return the first item's content in LOADED (from `magent-store-load')."
  (let* ((snapshot (plist-get loaded :snapshot))
         (turn (aref (alist-get 'turns snapshot) 0))
         (item (aref (alist-get 'items turn) 0)))
    (alist-get 'content item)))

(defun magent-store-test--show (session-id &rest args)
  "Return `magent-store show' of global SESSION-ID with ARGS, parsed."
  (with-temp-buffer
    (let ((status (apply #'call-process
                         (if (listp magent-store-python)
                             (car magent-store-python)
                           magent-store-python)
                         nil '(t nil) nil "show"
                         (expand-file-name (concat "global/" session-id ".json")
                                           magent-store-root)
                         args)))
      (should (eq status 0))
      (goto-char (point-min))
      (json-parse-buffer :object-type 'alist :null-object nil))))

(defun magent-store-test--stream (session-id chunks interval)
  "Append CHUNKS to item-1 of SESSION-ID, one every INTERVAL seconds.
Timers run between chunks, as they do while a real reply streams."
  (dolist (chunk chunks)
    (magent-store-append-item-content session-id "item-1" chunk)
    (magent-store-request-flush session-id)
    (sleep-for interval)))

(provide 'magent-store-test)
;;; magent-store-test.el ends here
