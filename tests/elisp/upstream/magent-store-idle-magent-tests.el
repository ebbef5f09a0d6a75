;;; magent-store-idle-magent-tests.el --- Idle-compacted sessions, read by magent's own readers  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions written through `magent-store-mode' by a real backend, then
;; compacted by the real `magent-store compact --idle-days', must read
;; back through upstream magent's real readers (loaded from MAGENT_LISP
;; and MAGENT_SESSION7) exactly as they did before: the schema-7 reader
;; from the files themselves, the release (schema 6) through the copy the
;; backend renders for it.  Equal means every field of the thread's
;; snapshot (`snapshot-created-at' and `last-event-seq' included), the
;; agent jobs, the approval overrides, the metadata and the scope; only
;; the journal, the history the log held past the snapshot, is gone.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-magent-tests)

(defvar magent-store-log-max-events)

(defun magent-store-idle-magent-test--state (file)
  "What magent's `magent-session-read-file' makes of the session FILE."
  (let* ((read (magent-session-read-file file))
         (session (plist-get read :session))
         (thread (and session (magent-session-thread-ledger session))))
    (should session)
    (list :snapshot (magent-thread-snapshot-to-alist thread)
          :jobs (mapcar #'magent-agent-job-to-alist (magent-session-agent-jobs session))
          :overrides (magent-session-approval-overrides session)
          :metadata (magent-session-metadata session)
          :scope (plist-get read :scope)
          :id (plist-get read :id)
          :journal (mapcar #'magent-thread-event-to-alist (magent-thread-journal thread)))))

(defun magent-store-idle-magent-test--state-7 (file)
  "What the schema-7 reader makes of the session FILE.
What `magent-session-read-file' does up to making the session: the rest
needs upstream's newer ledger, which is not public."
  (let* ((read (magent-session--read-validated-data file))
         (state (plist-get read :state))
         (thread (magent-thread-replay (plist-get state :snapshot)
                                       (plist-get state :events))))
    (list :snapshot (magent-thread-snapshot-to-alist thread)
          :jobs (mapcar #'magent-agent-job-to-alist (plist-get state :agent-jobs))
          :overrides (plist-get state :approval-overrides)
          :header (plist-get read :data)
          :scope (plist-get read :scope)
          :id (plist-get read :id)
          :journal (mapcar #'magent-thread-event-to-alist (magent-thread-journal thread)))))

(defun magent-store-idle-magent-test--states (sessions &optional reader)
  "The state of each of SESSIONS, ((SESSION . SCOPE) ...), as READER reads it.
READER defaults to `magent-store-idle-magent-test--state'."
  (mapcar (lambda (pair)
            (funcall (or reader #'magent-store-idle-magent-test--state)
                     (magent-store-magent-test--header-file (car pair) (cdr pair))))
          sessions))

(defun magent-store-idle-magent-test--compact (root)
  "Run the real idle compaction over ROOT, all sessions idle; return its output."
  ;; Every session was written a moment ago: a second later they are idle
  ;; for the smallest number of days the command takes.
  (sleep-for 1.2)
  (with-temp-buffer
    (let ((status (apply #'call-process (car (magent-store-program)) nil t nil
                         (append (cdr (magent-store-program))
                                 (list "compact" "--idle-days" "0.00001"
                                       (directory-file-name root))))))
      (should (equal (list status (buffer-string))
                     (list 0 (buffer-string))))
      (buffer-string))))

(defun magent-store-idle-magent-test--without-journal (state)
  "STATE without its journal."
  (cl-loop for (key value) on state by #'cddr
           unless (eq key :journal) append (list key value)))

(defun magent-store-idle-magent-test--logs (root)
  "The session logs under ROOT."
  (directory-files-recursively root "\\.jsonl\\'"))

(ert-deftest magent-store-idle-magent-schema-7-reader-reads-a-compacted-session-as-before ()
  "The schema-7 reader: the snapshot alone gives the thread the snapshot and log gave."
  (skip-unless magent-store-test-upstream-session7)
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((magent-store-log-max-events 40)
           (sessions (magent-store-magent-test--play))
           (root (magent-store-session-root))
           before after listed)
      (dolist (pair sessions)
        (magent-store-flush (magent-session-get-id (car pair))))
      (should-not magent-store-magent--adapter-failures)
      ;; Read as magent reads files it finds: the mode off, the backend stopped.
      (let ((magent-store-magent--export-offered t))
        (magent-store-mode -1))
      (magent-store-stop)
      (unwind-protect
          (progn
            (magent-store-magent-test--use-magent 7)
            (magent-store-magent-test--with-content-event
              (setq before (magent-store-idle-magent-test--states
                            sessions #'magent-store-idle-magent-test--state-7)))
            (setq listed (magent-session-list-files))
            (should (cdr listed))
            (should (= (length (magent-store-idle-magent-test--logs root)) (length sessions)))
            ;; Events past the snapshot: the log mattered to the thread.
            (should (cl-some (lambda (state) (plist-get state :journal)) before))
            (should (string-match-p (format "%d idle session(s) compacted" (length sessions))
                                    (magent-store-idle-magent-test--compact root)))
            (should-not (magent-store-idle-magent-test--logs root))
            (setq after (magent-store-idle-magent-test--states
                         sessions #'magent-store-idle-magent-test--state-7))
            ;; magent lists sessions by their header's time: the same order.
            (should (equal (magent-session-list-files) listed)))
        (magent-store-magent-test--use-magent 6))
      (cl-loop for old in before for new in after
               do (ert-info ((format "session %s" (plist-get old :id)))
                    (should (equal (magent-store-idle-magent-test--without-journal new)
                                   (magent-store-idle-magent-test--without-journal old)))
                    (should-not (plist-get new :journal)))))))

(ert-deftest magent-store-idle-magent-the-release-reads-a-compacted-session-as-before ()
  "magent's release, through the mode's rendered copy: the same session, journal too."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((magent-store-log-max-events 40)
           (sessions (magent-store-magent-test--play))
           (root (magent-store-session-root))
           before after)
      (dolist (pair sessions)
        (magent-store-flush (magent-session-get-id (car pair))))
      (setq before (magent-store-idle-magent-test--states sessions))
      (let ((magent-store-magent--export-offered t))
        (magent-store-mode -1))
      (magent-store-stop)
      (should (= (length (magent-store-idle-magent-test--logs root)) (length sessions)))
      (should (string-match-p (format "%d idle session(s) compacted" (length sessions))
                              (magent-store-idle-magent-test--compact root)))
      (should-not (magent-store-idle-magent-test--logs root))
      (magent-store-mode 1)
      (setq after (magent-store-idle-magent-test--states sessions))
      (should-not magent-store-magent--adapter-failures)
      (cl-loop for old in before for new in after
               do (ert-info ((format "session %s" (plist-get old :id)))
                    (should (equal new old)))))))

(ert-deftest magent-store-idle-magent-the-release-reads-its-own-file-as-before ()
  "magent's release, its own files (schema 6): the same thread, the journal emptied.
The mode is off: magent writes and reads its files itself."
  (magent-store-magent-test--use-magent 6)
  (let* ((tmp (file-truename (make-temp-file "magent-store-idle-" t)))
         (magent-session-directory (expand-file-name "sessions" tmp))
         (magent-action-session-directory nil)
         (magent-store-python (or magent-store-test-python magent-store-python)))
    (unwind-protect
        (let* ((sessions (magent-store-magent-test--play))
               (files (sort (directory-files-recursively magent-session-directory
                                                         "\\.json\\'")
                            #'string<))
               (time (- (float-time) 86400))
               before listed after)
          ;; Times the compaction would not give them (it goes in the order
          ;; of their names): their order in magent's list must stay.
          (dolist (file files)
            (set-file-times file (seconds-to-time (setq time (- time 60)))))
          (setq before (magent-store-idle-magent-test--states sessions)
                listed (magent-session-list-files))
          (should (cdr listed))
          (should-not magent-store-mode)
          (should (= (length files) (length sessions)))
          (should-not (magent-store-idle-magent-test--logs magent-session-directory))
          ;; magent's journal holds each event its snapshot holds too: history.
          (should (cl-every (lambda (state) (plist-get state :journal)) before))
          (should (string-match-p (format "%d idle session(s) compacted" (length sessions))
                                  (magent-store-idle-magent-test--compact
                                   magent-session-directory)))
          (dolist (file files)
            (with-temp-buffer
              (insert-file-contents file)
              (should (search-forward "\"journal\":[]" nil t))))
          (setq after (magent-store-idle-magent-test--states sessions))
          (should (equal (magent-session-list-files) listed))
          (cl-loop for old in before for new in after
                   do (ert-info ((format "session %s" (plist-get old :id)))
                        (should (equal (magent-store-idle-magent-test--without-journal new)
                                       (magent-store-idle-magent-test--without-journal old)))
                        (should-not (plist-get new :journal)))))
      (delete-directory tmp t))))

(provide 'magent-store-idle-magent-tests)
;;; magent-store-idle-magent-tests.el ends here
