;;; magent-store-scope-magent-tests.el --- A session saved under another scope, with and without the mode  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; magent files a session in the directory of the scope it is saved
;; under (`magent-session-save-for-session' SESSION SCOPE), whatever the
;; scope its thread was made in.  The same calls through upstream
;; magent's own code are played twice, magent alone and with
;; `magent-store-mode' (a real backend), and the files each leaves are
;; compared: a session made while the scope is global and saved under a
;; project, and one saved under global first and under the project
;; after.  magent alone leaves that first save behind under global/, a
;; second copy its listing shows beside the new one; the store moves the
;; session instead, so nothing of it stays behind there.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'subr-x)
(require 'magent-store-magent-tests)

(defconst magent-store-scope-test--first "s-made-global-saved-in-project"
  "A session made under global, first saved under a project.")

(defconst magent-store-scope-test--moved "s-saved-global-then-project"
  "A session saved under global, then under a project.")

(defun magent-store-scope-test--play (project)
  "Play the saves of two sessions made under global, PROJECT a project root.
Return the two magent sessions."
  (let ((first (magent-store-magent-test--session
                magent-store-scope-test--first 'global))
        (moved (magent-store-magent-test--session
                magent-store-scope-test--moved 'global)))
    (magent-store-magent-test--turn first project "First" 'completed)
    (magent-session-save-for-session first project)
    (magent-store-magent-test--turn moved 'global "One" 'completed)
    (magent-session-save-for-session moved 'global)
    (magent-store-magent-test--turn moved project "Two" 'completed)
    (magent-session-save-for-session moved project)
    (list first moved)))

(defun magent-store-scope-test--files (root &optional regexp)
  "The files under ROOT matching REGEXP (every file when nil), relative, sorted."
  (and (file-directory-p root)
       (sort (mapcar (lambda (file) (file-relative-name file root))
                     (directory-files-recursively root (or regexp "")))
             #'string<)))

(defun magent-store-scope-test--listed (scope)
  "The ids of the sessions magent's own listing shows for SCOPE, sorted."
  (sort (mapcar #'file-name-base (magent-session-list-files-for-scope scope))
        #'string<))

(defun magent-store-scope-test--turn-ids (session)
  "The ids of SESSION's turns, in order."
  (mapcar #'magent-thread-turn-id
          (magent-thread-turns (magent-session-thread-ledger session))))

(defun magent-store-scope-test--read-back (session scope)
  "Check that SESSION, saved under SCOPE, is stored whole and magent reads it.
The store's thread equals magent's to the last field; magent's own
reader (which reads an empty array back as nil) finds every turn."
  (magent-store-magent-test--should-equal
   (magent-store-magent-test--store-snapshot session scope)
   (magent-store-magent-test--magent-snapshot session))
  (let ((read (plist-get (magent-session-read-file
                          (magent-store-magent-test--header-file session scope))
                         :session)))
    (should read)
    (should (equal (magent-store-scope-test--turn-ids read)
                   (magent-store-scope-test--turn-ids session)))))

(ert-deftest magent-store-scope-a-session-is-filed-where-magent-saves-it ()
  "The same saves leave each session where magent alone leaves it: in the
directory of the scope it was last saved under, not the one its thread
was made in; and, unlike magent alone, no second copy where it was saved
before."
  (magent-store-magent-test--use-magent 6)
  (let* ((tmp (file-truename (make-temp-file "magent-store-scope-" t)))
         (project (let ((dir (expand-file-name "project" tmp)))
                    (make-directory dir)
                    (magent-session--normalize-project-root dir)))
         (magent-action-session-directory nil)
         (hash (secure-hash 'sha1 project))
         magent-alone magent-global)
    (unwind-protect
        (progn
          ;; magent alone.
          (let ((magent-session-directory (expand-file-name "alone" tmp)))
            (magent-store-scope-test--play project)
            (setq magent-alone (magent-store-scope-test--files
                                magent-session-directory "\\.json\\'"))
            (setq magent-global (magent-store-scope-test--listed 'global)))
          (should (equal magent-alone
                         (list (format "global/%s.json" magent-store-scope-test--moved)
                               (format "projects/%s/%s.json" hash
                                       magent-store-scope-test--first)
                               (format "projects/%s/%s.json" hash
                                       magent-store-scope-test--moved))))
          (should (equal magent-global (list magent-store-scope-test--moved)))
          ;; The same calls with the mode.
          (magent-store-magent-test--with-store
            (let ((sessions (magent-store-scope-test--play project))
                  (root magent-session-directory))
              ;; Where magent last saved each session, and only there.
              (should (equal (magent-store-scope-test--files root "\\.json\\'")
                             (cdr magent-alone)))
              (should-not (magent-store-scope-test--files
                           (expand-file-name "global" root)))
              (should (equal (magent-store-scope-test--listed project)
                             (list magent-store-scope-test--first
                                   magent-store-scope-test--moved)))
              (should-not (magent-store-scope-test--listed 'global))
              ;; Whole: magent reads each back as it holds it.
              (dolist (session sessions)
                (ert-info ((magent-session-get-id session))
                  (magent-store-scope-test--read-back session project)))
              (should-not magent-store-magent--adapter-failures))))
      (delete-directory tmp t))))

(ert-deftest magent-store-scope-a-moved-session-stays-one-after-a-restart ()
  "A new Emacs: magent loads the moved session from the project, whose
thread still says global, and goes on; its next turns join it there."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((project (magent-store-magent-test--project "restarted"))
           (moved (cadr (magent-store-scope-test--play project)))
           (root magent-session-directory)
           (file (magent-store-magent-test--header-file moved project)))
      ;; Another Emacs: nothing of this one's sessions, a new backend.
      (magent-store-stop)
      (clrhash magent-store--sessions)
      (clrhash magent-store-magent--headers-sent)
      (setq magent-store--recent nil)
      (let* ((loaded (magent-session-read-file file))
             (session (plist-get loaded :session))
             (scope (plist-get loaded :scope)))
        (should (equal scope project))
        (should (eq (magent-thread-scope (magent-session-thread-ledger session))
                    'global))
        ;; A plain turn: magent read an empty array back as nil, so the
        ;; full turn's mid-stream check (magent's thread against the
        ;; store's, field by field) would see magent's own read.
        (let* ((thread (magent-session-thread-ledger session))
               (turn-id (magent-thread-turn-id
                         (magent-thread-create-turn thread "Three")))
               (item (magent-thread-start-item thread turn-id 'message
                                               :role 'assistant)))
          (magent-thread-append-item-content thread item "Third answer")
          (magent-session-save-deferred-for-session session scope)
          (magent-thread-complete-item thread item :content "Third answer")
          (magent-thread-complete-turn thread turn-id nil))
        (magent-session-save-for-session session scope)
        (should (equal (magent-store-scope-test--files root "\\.json\\'")
                       (list (format "projects/%s/%s.json"
                                     (secure-hash 'sha1 project)
                                     magent-store-scope-test--first)
                             (format "projects/%s/%s.json"
                                     (secure-hash 'sha1 project)
                                     magent-store-scope-test--moved))))
        (should-not (magent-store-scope-test--files
                     (expand-file-name "global" root)))
        ;; Every turn, in the one copy magent lists (the session magent
        ;; read holds an empty array as nil: the turns are compared).
        (should (= (length (magent-store-scope-test--turn-ids session)) 3))
        (should (equal (magent-store-scope-test--turn-ids
                        (plist-get (magent-session-read-file file) :session))
                       (magent-store-scope-test--turn-ids session)))
        (should-not magent-store-magent--adapter-failures)))))

(provide 'magent-store-scope-magent-tests)
;;; magent-store-scope-magent-tests.el ends here
