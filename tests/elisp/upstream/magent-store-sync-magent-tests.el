;;; magent-store-sync-magent-tests.el --- A session another machine continued while magent held it  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Emacs left open on this machine holds a session in magent's memory;
;; another machine continues it, and the sync engine renames that
;; machine's copy of the log into place.  magent here then goes on with
;; its own turn and saves.  Both lines of turns must be kept, in sessions
;; magent itself lists and reads (upstream's real code, from
;; MAGENT_LISP, through `magent-store-mode', and magent's schema-7
;; reader where MAGENT_SESSION7 names it), and the user told once where
;; each is.  A real backend over a real EPC socket.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'json)
(require 'magent-store-resume-tests)
(require 'magent-store-magent-tests)
(require 'magent-store-idle-magent-tests)

(defvar magent-session-directory)
(defvar magent-store-magent--export-offered)

(defun magent-store-sync-test--event (seq thread time type turn item payload)
  "The log line of event SEQ of THREAD at TIME: TYPE on TURN and ITEM with PAYLOAD."
  (concat (json-encode `((seq . ,seq) (type . ,type) (thread-id . ,thread)
                         (turn-id . ,turn) (item-id . ,item)
                         (payload . ,payload) (created-at . ,time)))
          "\n"))

(defun magent-store-sync-test--continue-elsewhere (log turn text)
  "Continue the session of LOG on another machine: TURN asking TEXT.
As a sync engine brings it: a copy of the log with the new events,
written beside it and renamed into place."
  (let* ((data (with-temp-buffer
                 (insert-file-contents-literally log)
                 (buffer-string)))
         (last-line (car (last (split-string data "\n" t))))
         (last (json-parse-string last-line :object-type 'alist :null-object nil))
         (seq (alist-get 'seq last))
         (thread (alist-get 'thread-id last))
         (time (+ (alist-get 'created-at last) 60))
         (item (concat turn "-u"))
         (copy (expand-file-name (concat ".syncthing." (file-name-nondirectory log) ".tmp")
                                 (file-name-directory log)))
         (turn-object
          (lambda (status)
            `((id . ,turn) (thread-id . ,thread) (op-id . nil) (status . ,status)
              (input . ,text) (items . []) (error . nil) (usage . nil) (metadata . nil)
              (queued-at . ,time) (started-at . nil) (completed-at . nil)
              (duration-ms . nil))))
         (item-object
          (lambda (status)
            `((id . ,item) (turn-id . ,turn) (type . "message") (status . ,status)
              (role . "user") (content . ,text) (name . nil) (call-id . nil)
              (input . nil) (output . nil) (error . nil) (phase . nil)
              (metadata . nil) (created-at . ,(+ time 2)) (updated-at . ,(+ time 2))
              (completed-at . nil))))
         (lines
          (list
           (magent-store-sync-test--event
            (+ seq 1) thread time "turn-queued" turn nil
            `((turn . ,(funcall turn-object "queued"))))
           (magent-store-sync-test--event
            (+ seq 2) thread (+ time 1) "turn-started" turn nil
            `((turn . ,(funcall turn-object "in-progress"))))
           (magent-store-sync-test--event
            (+ seq 3) thread (+ time 2) "item-started" turn item
            `((item . ,(funcall item-object "pending"))))
           (magent-store-sync-test--event
            (+ seq 4) thread (+ time 3) "item-completed" turn item
            `((item . ,(funcall item-object "completed"))))
           (magent-store-sync-test--event
            (+ seq 5) thread (+ time 4) "turn-completed" turn nil
            '((usage . nil))))))
    (let ((coding-system-for-write 'utf-8-unix))
      (with-temp-file copy
        (set-buffer-multibyte nil)
        (insert data)
        (dolist (line lines) (insert (encode-coding-string line 'utf-8)))))
    (rename-file copy log t)))

(defun magent-store-sync-test--fork (id)
  "The id of the one fork of session ID in the global folder (named ID.MACHINE-DIGITS)."
  (let ((found (directory-files (expand-file-name "global" magent-session-directory) nil
                                (concat "\\`" (regexp-quote id) "\\.[A-Za-z0-9_-]+\\.json\\'"))))
    (should (= (length found) 1))
    (file-name-sans-extension (car found))))

(defun magent-store-sync-test--inputs (session)
  "The inputs of SESSION's turns, in order."
  (mapcar #'magent-thread-turn-input
          (magent-thread-turns (magent-session-thread-ledger session))))

(ert-deftest magent-store-sync-a-session-continued-elsewhere-while-open-keeps-both-lines ()
  "The other machine's turn stays the session; this one's goes on in a fork magent lists and reads."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((id "20261202-100000-s")
           (session (magent-store-resume-test--new-session id))
           (log (expand-file-name (concat "global/" id ".jsonl") magent-session-directory))
           (magent-store-resume-test--messages nil))
      (magent-store-flush id)
      (magent-store-sync-test--continue-elsewhere log "elsewhere-turn" "asked on the other machine")
      ;; This Emacs goes on with the session magent holds: it knows nothing of that turn.
      (magent-store-resume-test--converse session 1)
      (advice-add 'message :before #'magent-store-resume-test--record-message)
      (unwind-protect
          (progn
            (magent-session-save-for-session session 'global)
            (magent-store-flush id))
        (advice-remove 'message #'magent-store-resume-test--record-message))
      (let* ((fork (magent-store-sync-test--fork id))
             (told (cl-remove-if-not
                    (lambda (m) (string-match-p "continued on another machine" m))
                    magent-store-resume-test--messages)))
        (should (= (length told) 1))
        (should (string-match-p (regexp-quote (format "in the new session %s" fork)) (car told)))
        (magent-store-resume-test--restart)
        (let* ((files (magent-session-list-files))
               (parent-file (expand-file-name (concat "global/" id ".json")
                                              magent-session-directory))
               (fork-file (expand-file-name (concat "global/" fork ".json")
                                            magent-session-directory)))
          (should (member parent-file files))
          (should (member fork-file files))
          (let ((parent (plist-get (magent-session-read-file parent-file) :session))
                (forked (plist-get (magent-session-read-file fork-file) :session))
                (meta (magent-session--read-file-metadata-cached fork-file)))
            ;; The other machine's turn stays in the session.
            (should (equal (car (last (magent-store-sync-test--inputs parent)))
                           "asked on the other machine"))
            (should (= (length (magent-store-sync-test--inputs parent)) 3))
            ;; This machine's turn is in the fork, after the turns both had.
            (should (= (length (magent-store-sync-test--inputs forked)) 3))
            (should-not (member "asked on the other machine"
                                (magent-store-sync-test--inputs forked)))
            (should (equal (magent-session-metadata-value forked 'parent-session-id) id))
            (should (string-prefix-p (format "Continued on %s" (system-name))
                                     (magent-session-metadata-value forked 'title)))
            (should (plist-get meta :valid))
            (should (string-prefix-p (format "Continued on %s" (system-name))
                                     (plist-get meta :title))))
          ;; magent's schema-7 reader, from the files alone.
          (let ((magent-store-magent--export-offered t))
            (magent-store-mode -1))
          (magent-store-stop)
          (when (magent-store-magent-test--use-magent 7)
            (unwind-protect
                (magent-store-magent-test--with-content-event
                  (let ((forked (magent-store-idle-magent-test--state-7 fork-file))
                        (parent (magent-store-idle-magent-test--state-7 parent-file)))
                    (should (equal (alist-get 'parent-session-id (plist-get forked :header)) id))
                    (should (equal (plist-get forked :id) fork))
                    (should (= 3 (length (alist-get 'turns (plist-get forked :snapshot)))))
                    (should (= 3 (length (alist-get 'turns (plist-get parent :snapshot)))))))
              (magent-store-magent-test--use-magent 6))))))))

;; After the fork, this Emacs writes the fork: a backend that restarts
;; (crashed, or `magent-store-restart') must open the fork again, not the
;; session it came from, and a batch sent again must land there once.
(ert-deftest magent-store-sync-a-fork-goes-on-after-the-backend-restarts ()
  "This machine's next turn after a backend restart goes to the fork, once; the parent keeps the other machine's."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((id "20261202-110000-r")
           (session (magent-store-resume-test--new-session id))
           (log (expand-file-name (concat "global/" id ".jsonl") magent-session-directory))
           (fork nil))
      (magent-store-flush id)
      (magent-store-sync-test--continue-elsewhere log "elsewhere-turn" "asked on the other machine")
      (magent-store-resume-test--converse session 1)
      (magent-session-save-for-session session 'global)
      (magent-store-flush id)
      (setq fork (magent-store-sync-test--fork id))
      (should (file-exists-p (expand-file-name (concat "global/" fork ".json")
                                               magent-session-directory)))
      (let ((status (json-parse-string (magent-store-call "status" nil) :object-type 'alist)))
        (should (= (alist-get 'forks-made status) 1))
        (should (= (alist-get 'conflict-copies-merged status) 0)))
      ;; The backend goes away with this Emacs's session still open in it.
      (magent-store-restart)
      (magent-store-resume-test--converse session 1)
      (magent-session-save-for-session session 'global)
      (magent-store-flush id)
      (magent-store-resume-test--restart)
      (let* ((parent-file (expand-file-name (concat "global/" id ".json") magent-session-directory))
             (fork-file (expand-file-name (concat "global/" fork ".json") magent-session-directory))
             (parent (plist-get (magent-session-read-file parent-file) :session))
             (forked (plist-get (magent-session-read-file fork-file) :session)))
        ;; The parent: the turns both had, then the other machine's; nothing of this one's after.
        (should (equal (car (last (magent-store-sync-test--inputs parent)))
                       "asked on the other machine"))
        (should (= (length (magent-store-sync-test--inputs parent)) 3))
        ;; The fork: the turns both had, then this machine's two, each once.
        (should (equal (magent-store-sync-test--inputs forked)
                       (magent-store-sync-test--inputs session)))
        (should (= (length (magent-store-sync-test--inputs forked)) 4))))))

(provide 'magent-store-sync-magent-tests)
;;; magent-store-sync-magent-tests.el ends here
