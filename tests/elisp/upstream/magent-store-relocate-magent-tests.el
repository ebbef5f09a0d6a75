;;; magent-store-relocate-magent-tests.el --- magent finds a moved project's sessions  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store relocate OLD NEW' must put a project's sessions where
;; magent's own code looks for NEW, as magent itself would have written
;; them there.  Judged by upstream magent's real functions (MAGENT_LISP,
;; and the schema-7 magent-session.el from MAGENT_SESSION7): the
;; directory it keys a project by (`magent-session--normalize-project-root'
;; then `magent-session--scope-storage-directory') against the one the
;; command moves to, for roots written in several ways; and sessions
;; magent saved itself (schema 6 by the release, schema 7 by the newer
;; reader and writer), moved by the real command after their folder
;; moved, listed and read back by magent under the new root exactly as
;; before the move but for the root.  No `magent-store-mode' here:
;; magent writes and reads its own files.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test-upstream)
(require 'magent-store-magent-tests)
(require 'magent-store-resume-tests)

(defvar magent-session-directory)
(defvar magent-session--metadata-cache)
(defvar magent-session--loaded-sessions)
(defvar magent-session--scoped-sessions)
(defvar magent-session-log-max-events)

(defun magent-store-relocate-magent-test--cli (&rest args)
  "Run the magent-store command with ARGS; return (STATUS . OUTPUT)."
  (with-temp-buffer
    (let ((status (apply #'call-process magent-store-test-python nil t nil args)))
      (cons status (buffer-string)))))

(defun magent-store-relocate-magent-test--target (root project)
  "Return the folder (relative to ROOT) the command moves PROJECT's sessions to."
  (pcase-let ((`(,status . ,output)
               (magent-store-relocate-magent-test--cli
                "relocate" "--dry-run" "--json" "/nowhere/at/all" project root)))
    (should (eq status 0))
    (alist-get 'to (json-parse-string output :object-type 'alist))))

(defun magent-store-relocate-magent-test--moved (value old new)
  "Return VALUE with every string equal to OLD replaced by NEW."
  (cond ((equal value old) new)
        ((consp value)
         (cons (magent-store-relocate-magent-test--moved (car value) old new)
               (magent-store-relocate-magent-test--moved (cdr value) old new)))
        ((vectorp value)
         (vconcat (mapcar (lambda (v) (magent-store-relocate-magent-test--moved v old new))
                          value)))
        (t value)))

(defmacro magent-store-relocate-magent-test--with-root (&rest body)
  "Run BODY with magent's caches fresh, `base' a private folder, sessions in it."
  (declare (indent 0) (debug t))
  `(let* ((base (file-truename (make-temp-file "magent-store-relocate-" t)))
          (magent-session-directory (expand-file-name "sessions" base))
          (magent-session--metadata-cache (make-hash-table :test #'equal))
          (magent-session--loaded-sessions (make-hash-table :test #'eq))
          (magent-session--scoped-sessions (make-hash-table :test #'equal)))
     (unwind-protect (progn ,@body)
       (delete-directory base t))))

(defun magent-store-relocate-magent-test--rule ()
  "Check the command keys roots as the magent loaded now does."
  (magent-store-relocate-magent-test--with-root
    (let* ((real (expand-file-name "réel projet" base))
           (default-directory (file-name-as-directory base)))
      (make-directory real)
      (make-directory magent-session-directory)
      (make-symbolic-link real (expand-file-name "alias" base))
      (dolist (root (list real (file-name-as-directory real)
                          (expand-file-name "alias" base)
                          (expand-file-name "alias/sub/../later/" base)
                          (expand-file-name "not/there/yet" base)
                          "alias/"))
        (ert-info ((format "root %S" root))
          (should (equal (magent-store-relocate-magent-test--target
                          magent-session-directory root)
                         (file-relative-name
                          (magent-session--scope-storage-directory
                           (magent-session--normalize-project-root root))
                          magent-session-directory))))))))

(ert-deftest magent-store-relocate-keys-a-root-as-magent-does ()
  "The folder the command moves to is the one magent's own functions give."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-magent-test--use-magent 6)
  (magent-store-relocate-magent-test--rule)
  (when (magent-store-magent-test--use-magent 7)
    (unwind-protect (magent-store-relocate-magent-test--rule)
      (magent-store-magent-test--use-magent 6))))

(defun magent-store-relocate-magent-test--move-and-read (schema)
  "Save a session of a project through magent, move the project, relocate, read it.
magent must find it under the new root exactly as it was, but for the
root.  SCHEMA is the format magent writes (6: one file; 7: a log beside)."
  (magent-store-relocate-magent-test--with-root
    (let* ((old-folder (expand-file-name "old name" base))
           (new-folder (expand-file-name "new ünï name" base)))
      (make-directory old-folder)
      (let* ((old (magent-session--normalize-project-root old-folder))
             (session (magent-store-resume-test--new-session "20261201-220000-r" old))
             (files (progn
                      ;; Resumed and saved again, as magent does: what it read
                      ;; (the session's origin, say) is saved with it.
                      (magent-session-save-for-session
                       (plist-get (magent-session-read-file
                                   (car (magent-session-list-files-for-scope old)))
                                  :session)
                       old)
                      (clrhash magent-session--metadata-cache)
                      (magent-session-list-files-for-scope old)))
             (before (magent-store-resume-test--state
                      (plist-get (magent-session-read-file (car files)) :session)))
             (meta (magent-session--read-file-metadata (car files))))
        (ignore session)
        (should (= (length files) 1))
        (should (equal (plist-get meta :project-root) old))
        ;; The project moves: magent, keyed by the new root, finds nothing.
        (rename-file old-folder new-folder)
        (let ((new (magent-session--normalize-project-root new-folder)))
          (clrhash magent-session--metadata-cache)
          (should-not (magent-session-list-files-for-scope new))
          (pcase-let ((`(,status . ,output)
                       (magent-store-relocate-magent-test--cli
                        "relocate" old new-folder magent-session-directory)))
            (should (eq status 0))
            (should (string-match-p "^1 session moved and verified" output)))
          (clrhash magent-session--metadata-cache)
          (clrhash magent-session--loaded-sessions)
          (clrhash magent-session--scoped-sessions)
          (should-not (magent-session-list-files-for-scope old))
          (let ((moved (magent-session-list-files-for-scope new)))
            (should (= (length moved) 1))
            (should (eq (file-exists-p (concat (file-name-sans-extension (car moved)) ".jsonl"))
                        (= schema 7)))
            (should (equal (magent-session--read-file-metadata (car moved))
                           (magent-store-relocate-magent-test--moved meta old new)))
            (let ((after (plist-get (magent-session-read-file (car moved)) :session)))
              (should (equal (magent-store-resume-test--state after)
                             (magent-store-relocate-magent-test--moved before old new)))
              ;; Saved again by magent, it stays the new project's.
              (magent-session-save-for-session after new)
              (clrhash magent-session--metadata-cache)
              (should (equal (magent-session-list-files-for-scope new) moved))
              (should (equal (plist-get (magent-session--read-file-metadata (car moved))
                                        :project-root)
                             new)))))))))

(ert-deftest magent-store-relocate-magent-release-finds-moved-schema-6-sessions ()
  "magent's release lists and reads a moved project's sessions under its new root."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-magent-test--use-magent 6)
  (magent-store-relocate-magent-test--move-and-read 6))

(ert-deftest magent-store-relocate-schema-7-magent-finds-moved-sessions ()
  "magent reading and writing schema 7 itself finds a moved project's sessions."
  (skip-unless (and (magent-store-test-upstream-available-p)
                    magent-store-test-upstream-session7))
  (let ((tail-standin (not (fboundp 'magent-thread-journal-tail)))
        (magent-session-log-max-events
         (if (boundp 'magent-session-log-max-events) magent-session-log-max-events 2000)))
    (when tail-standin
      (defalias 'magent-thread-journal-tail
        (lambda (thread) (last (magent-thread-journal thread)))))
    (unwind-protect
        (progn
          (magent-store-magent-test--use-magent 7)
          (should (eql magent-session-schema-version 7))
          (magent-store-magent-test--with-content-event
            (magent-store-relocate-magent-test--move-and-read 7)))
      (magent-store-magent-test--use-magent 6)
      (when tail-standin (fmakunbound 'magent-thread-journal-tail)))))

(provide 'magent-store-relocate-magent-tests)
;;; magent-store-relocate-magent-tests.el ends here
