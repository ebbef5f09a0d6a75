;;; magent-store-magent-schema6.el --- Answering magent's schema-6 reader from the store  -*- lexical-binding: t; -*-

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

;; The part of the adapter to magent (magent-store-magent.el) that a
;; magent reading schema 7 itself will not need: magent's listing and
;; reader answered from the store for magent's current release, which
;; reads schema 6 (the backend renders each session into the shape that
;; release reads, and magent's own reader builds the session from it),
;; and writing the sessions back for that release when the mode is
;; turned off for good (`magent-store-export-for-magent').  The mode
;; loads this file; it can go when magent reads schema 7.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'magent-store)
(require 'magent-store-json)
(require 'magent-store-layout)
(require 'magent-store-magent)

;;;; Read side: magent's listing and reader, answered from the store

;; magent finds sessions by their `<id>.json' files, which are the
;; store's headers.  A magent that reads schema 7 itself only needs what
;; Emacs has not sent yet to be flushed first.  magent's current release
;; (schema 6) cannot read them: for it the backend renders the session
;; into a private file in exactly the shape that release reads, and
;; magent's own reader builds the session object from it, so magent's
;; semantics are used, not re-implemented here.

(defvar magent-session-schema-version)
(defvar magent-session--loaded-sessions)

(defcustom magent-store-export-command nil
  "Command (a list of strings) that runs the backend's command line.
nil means `magent-store-python' without its \"serve\" argument."
  :type '(choice (const :tag "The backend command" nil) (repeat string))
  :group 'magent-store)

(defvar magent-store-magent--damage-told nil
  "Session files whose damage the user was told about in this Emacs.")

(defun magent-store-magent--schema ()
  "Return the schema version of the loaded magent, or nil."
  (and (boundp 'magent-session-schema-version)
       magent-session-schema-version))

(defun magent-store-magent--file-schema (filepath)
  "Return the schema-version FILEPATH declares, reading only its start.
Both magent and the store write the version among the first fields, so
a megabyte session costs a few hundred bytes here."
  (condition-case nil
      (with-temp-buffer
        (let ((coding-system-for-read 'utf-8-unix))
          (insert-file-contents filepath nil 0 512))
        (goto-char (point-min))
        (when (re-search-forward "\"schema-version\" *: *\\([0-9]+\\)" nil t)
          (string-to-number (match-string 1))))
    (file-error nil)))

(defun magent-store-magent--rendered-p (filepath)
  "Non-nil when FILEPATH is a store header the loaded magent cannot read."
  (and (eql (magent-store-magent--schema) 6)
       (eql (magent-store-magent--file-schema filepath) 7)))

(defun magent-store-magent--flush-pending (&optional id)
  "Flush session ID (every session when nil) when Emacs has unsent entries."
  (when (and (null id) magent-store-magent--header-timer)
    ;; Now, not from a timer that would outlive the flush (and the mode).
    (cancel-timer magent-store-magent--header-timer)
    (magent-store-magent--refresh-deferred-headers))
  (magent-store-flush-unsent id))

(defun magent-store-magent--call-rendered (filepath hollow function)
  "Call FUNCTION with FILEPATH's session rendered for magent, and its damage.
HOLLOW renders the header fields only.  The rendered file is deleted
afterwards, whatever FUNCTION does."
  (magent-store-ensure-backend)
  (let* ((reply (magent-store-call "render"
                                    (list (expand-file-name filepath)
                                          (and hollow t))))
         (file (nth 0 reply)))
    (unwind-protect (funcall function file (nth 1 reply))
      (ignore-errors (delete-file file))
      (ignore-errors (delete-directory (file-name-directory file))))))

(defun magent-store-magent--around-read-file (orig filepath)
  "Answer magent's ORIG reader for FILEPATH from the store.
What Emacs has not sent yet is flushed first; a schema-7 session is
rendered for a magent that reads only schema 6.  Nothing here signals
into magent's call: a session that cannot be read is nil, as for magent."
  (magent-store-magent--flush-pending (file-name-base filepath))
  (if (not (magent-store-magent--rendered-p filepath))
      (funcall orig filepath)
    (condition-case err
        (magent-store-magent--call-rendered
         filepath nil
         (lambda (file damage)
           (when (and damage (not (member filepath magent-store-magent--damage-told)))
             (push filepath magent-store-magent--damage-told)
             (message "magent-store: session %s is damaged (%s); showing what \
could be read.  `magent-store fsck --repair' repairs what it can"
                      (file-name-base filepath) damage))
           (let ((loaded (funcall orig file)))
             (when-let ((session (plist-get loaded :session)))
               ;; magent remembers where a session came from: the real file.
               (puthash session filepath magent-session--loaded-sessions))
             loaded)))
      (error (magent-store-magent--failed "reading a session for magent" err)
             nil))))

(defun magent-store-magent--damaged-metadata (meta damage filepath)
  "Return META, magent's metadata of FILEPATH, saying it is damaged by DAMAGE.
A damaged session is listed, its title saying so, rather than hidden."
  (when (and damage (plist-get meta :valid))
    (let ((label (format "[damaged: %s]" damage)))
      (setq meta (plist-put meta :status "damaged"))
      (setq meta (plist-put meta :damage damage))
      (setq meta (plist-put meta :summary-title
                            (string-trim
                             (concat label " "
                                     (or (plist-get meta :summary-title)
                                         (file-name-base filepath))))))
      (when (plist-get meta :title)
        (setq meta (plist-put meta :title
                              (concat label " " (plist-get meta :title)))))))
  meta)

(defun magent-store-magent--around-read-file-metadata (orig filepath)
  "Answer magent's ORIG metadata reader for FILEPATH, for the session picker.
A damaged session is listed, its title saying so, rather than hidden."
  (if (not (magent-store-magent--rendered-p filepath))
      (funcall orig filepath)
    (condition-case err
        (magent-store-magent--call-rendered
         filepath t
         (lambda (file damage)
           (magent-store-magent--damaged-metadata (funcall orig file) damage filepath)))
      (error (magent-store-magent--failed "listing a session for magent" err)
             (funcall orig filepath)))))

(defvar magent-store-magent--listing-times nil
  "While magent lists sessions: a table of file -> display time, or nil.
magent's sort asks for each file's time at every comparison.")

(defun magent-store-magent--around-file-display-time (orig filepath)
  "Return ORIG's time of FILEPATH, or of its log when that is newer.
The store rewrites a header only when it changes; the log moves with
every flush, and magent sorts its picker by this time."
  (let ((cache magent-store-magent--listing-times))
    (or (and cache (gethash filepath cache))
        (let* ((time (funcall orig filepath))
               (log (file-attribute-modification-time
                     (file-attributes (magent-store-session-file
                                       'log (file-name-base filepath)
                                       (file-name-directory filepath)))))
               (newest (if (and log time (time-less-p time log)) log time)))
          (when (and cache newest) (puthash filepath newest cache))
          newest))))

(defun magent-store-magent--around-list (orig &rest args)
  "Call ORIG, magent's listing, with ARGS after a flush of what Emacs has.
Each file's time is looked up once per listing, however often the sort
compares it."
  (magent-store-magent--guarded "a flush before magent lists"
    (magent-store-magent--flush-pending))
  (let ((magent-store-magent--listing-times (make-hash-table :test #'equal)))
    (apply orig args)))

(defconst magent-store-magent--listing-gc-threshold (* 64 1024 1024)
  "The least `gc-cons-threshold' while magent lists sessions with the mode on.
A listing of thousands of sessions holds every session's metadata while
it conses: collecting every 800 kB went over all of it each time.")

(defvar magent-store-magent--listing-metadata nil
  "While magent lists sessions: a table of file -> magent's metadata, or nil.
magent's sort looks a file's metadata up at every comparison, and each
lookup reads the file's attributes to check its cache.")

(defun magent-store-magent--around-metadata-cached (orig filepath)
  "Return ORIG's metadata of FILEPATH, looked up once per listing."
  (let ((table magent-store-magent--listing-metadata))
    (if (not table)
        (funcall orig filepath)
      (or (gethash filepath table)
          (puthash filepath (funcall orig filepath) table)))))

(defun magent-store-magent--around-list-files (orig &rest args)
  "Call ORIG, magent's listing of every session, with ARGS.
As `magent-store-magent--around-list', with every session's metadata and
time asked of the backend in one call first, and each file's metadata
looked up once."
  (magent-store-magent--guarded "a flush before magent lists"
    (magent-store-magent--flush-pending))
  (let ((magent-store-magent--listing-times (make-hash-table :test #'equal))
        (magent-store-magent--listing-metadata (make-hash-table :test #'equal))
        (gc-cons-threshold (max gc-cons-threshold
                                magent-store-magent--listing-gc-threshold)))
    (magent-store-magent--guarded "listing the sessions for magent"
      (magent-store-magent--prefill nil))
    (apply orig args)))

(defun magent-store-magent--around-list-scope (orig scope &rest args)
  "Call ORIG, magent's listing of SCOPE's sessions, with SCOPE and ARGS.
As `magent-store-magent--around-list-files', for SCOPE's folder only."
  (magent-store-magent--guarded "a flush before magent lists"
    (magent-store-magent--flush-pending))
  (let ((magent-store-magent--listing-times (make-hash-table :test #'equal))
        (magent-store-magent--listing-metadata (make-hash-table :test #'equal))
        (gc-cons-threshold (max gc-cons-threshold
                                magent-store-magent--listing-gc-threshold)))
    (when scope
      (magent-store-magent--guarded "listing the sessions for magent"
        (magent-store-magent--prefill
         (magent-session--scope-storage-directory scope))))
    (apply orig scope args)))

(declare-function magent-session--scope-storage-directory "ext:magent-session"
                  (scope))
(declare-function magent-session-validate-id "ext:magent-session" (id))
(declare-function magent-session--clean-summary-title "ext:magent-session"
                  (text))
(declare-function magent-session--normalize-project-root "ext:magent-session"
                  (root))
(declare-function magent-session--approval-override-from-alist
                  "ext:magent-session" (entry))
(declare-function magent-agent-job-from-alist "ext:magent-agent-job" (alist))
(defvar magent-session--metadata-cache)

(defconst magent-store-magent--picker-functions
  '(magent-session-validate-id magent-session--clean-summary-title
    magent-session--normalize-project-root
    magent-session--approval-override-from-alist magent-agent-job-from-alist)
  "The magent functions the picker's metadata is built with, all needed.")

(defvar magent-store-magent--project-roots nil
  "While the backend's listing is read: project root -> magent's form of it.
Thousands of sessions share a few project roots.")

(defun magent-store-magent--prefill (directory)
  "Fill magent's metadata cache with the sessions under DIRECTORY, in one call.
DIRECTORY nil means every session.  Only for a magent that reads schema
6 (the store's sessions are rendered for it): each session's metadata is
what magent's reader makes of its rendered file, keyed as magent's cache
keys it (the header's size and time), so magent reads none of them
again; and each session's metadata and time for the listing's sort.  A
session the backend does not list, or whose header changed since, is
read as before."
  (when (and (eql (magent-store-magent--schema) 6)
             (boundp 'magent-session--metadata-cache)
             (hash-table-p magent-session--metadata-cache)
             (cl-every #'fboundp magent-store-magent--picker-functions))
    (magent-store-ensure-backend)
    (let* ((base (file-name-as-directory
                  (expand-file-name (symbol-value 'magent-session-directory))))
           (entries (json-parse-string
                     (magent-store-call
                      "listing" (list base (and directory
                                                (expand-file-name directory))))
                     :object-type 'alist :array-type 'list
                     :null-object nil :false-object magent-store-json-false))
           (cache magent-session--metadata-cache)
           (times magent-store-magent--listing-times)
           (memo magent-store-magent--listing-metadata)
           (magent-store-magent--project-roots (make-hash-table :test #'equal)))
      (dolist (entry entries)
        (let* ((file (expand-file-name (cdr (assq 'file entry)) base))
               (key (let ((k (cdr (assq 'key entry))))
                      (list (car k) (magent-store-magent--lisp-time (cdr k)))))
               (old (gethash file cache)))
          (when times
            (puthash file (magent-store-magent--lisp-time (cdr (assq 'time entry)))
                     times))
          (if (equal (plist-get old :key) key)
              (when memo (puthash file (plist-get old :metadata) memo))
            (when-let ((meta (magent-store-magent--picker-metadata
                              file (cdr (assq 'fields entry))
                              (cdr (assq 'damage entry)))))
              (puthash file (list :key key :metadata meta) cache)
              (when memo (puthash file meta memo)))))))))

(defun magent-store-magent--lisp-time (pair)
  "Return PAIR, (SECONDS NANOSECONDS), as `file-attributes' gives a time."
  (let ((seconds (car pair)) (nanoseconds (cadr pair)))
    (list (ash seconds -16) (logand seconds #xffff)
          (/ nanoseconds 1000) (* (% nanoseconds 1000) 1000))))

(defun magent-store-magent--project-root (root)
  "Return magent's normalized form of project ROOT, once per listing."
  (let ((roots magent-store-magent--project-roots))
    (if (not (and roots root))
        (magent-session--normalize-project-root root)
      (let ((known (gethash root roots 'none)))
        (if (not (eq known 'none))
            known
          (puthash root (magent-session--normalize-project-root root) roots))))))

(defun magent-store-magent--picker-metadata (file fields damage)
  "Return magent's listing metadata of FILE, a session with header FIELDS.
What magent's own reader makes of the file rendered for it, with magent's
own functions, checks included; DAMAGE as the render says it.  nil when
a check fails: magent's reader then reads that session itself."
  (condition-case nil
      (let* ((id (magent-session-validate-id (cdr (assq 'id fields))))
             (scope-name (cdr (assq 'scope fields)))
             (project-root (cdr (assq 'project-root fields)))
             (title (cdr (assq 'title fields))))
        (mapc #'magent-agent-job-from-alist (cdr (assq 'agent-jobs fields)))
        (mapc #'magent-session--approval-override-from-alist
              (cdr (assq 'approval-overrides fields)))
        (when (and (equal id (file-name-base file))
                   (member scope-name '("global" "project"))
                   (or (stringp project-root)
                       (not (equal scope-name "project"))))
          (magent-store-magent--damaged-metadata
           (list :valid t
                 :id id
                 :scope (if (equal scope-name "project") 'project 'global)
                 :project-root (magent-store-magent--project-root project-root)
                 :summary-title (or (magent-session--clean-summary-title title)
                                    (magent-session--clean-summary-title
                                     (cdr (assq 'summary-title fields))))
                 :kind (cdr (assq 'kind fields))
                 :action (cdr (assq 'action fields))
                 :status (cdr (assq 'status fields))
                 :title title
                 :parent-session-id (cdr (assq 'parent-session-id fields))
                 :metadata (cdr (assq 'metadata fields)))
           damage file)))
    (error nil)))

;;;; Leaving: sessions written back for magent's release

(defun magent-store-magent--schema7-headers ()
  "Return the store's schema-7 headers under the session root."
  (let (found)
    (dolist (dir (magent-store-scope-directory '*))
      (dolist (file (magent-store-session-headers dir))
        (when (eql (magent-store-magent--file-schema file) 7)
          (push file found))))
    (nreverse found)))

(defun magent-store-magent--export-command ()
  "Return the command line of an export to schema 6."
  (append (or magent-store-export-command
              (butlast (magent-store-program-command)))
          (list "export" (magent-store-session-root) "--schema" "6")))

(defvar magent-store-magent--export-offered nil
  "Non-nil once turning the mode off told the user about the export.")

(defvar magent-store-magent--exported nil
  "Non-nil once `magent-store-export-for-magent' gave magent its files back.
Toggling the mode on again then asks first: a user who means to turn it
off would otherwise have the next save take every session over again.")

;;;###autoload
(defun magent-store-export-for-magent ()
  "Write every session of the store back in the format of magent's release.
Each session is checked value by value against the store before it
replaces the store's files, which are copied to a backup first; running
it again changes nothing.  `magent-store-mode' is turned off, and the
sessions open in magent-store are flushed and closed, first; the last
message says so.  Return the summary line."
  (interactive)
  (when magent-store-mode
    ;; Left on, the mode would take each session over again at its next
    ;; save.  Writing them back is what this does: no offer to.
    (let ((magent-store-magent--export-offered t))
      (magent-store-mode -1)))
  (setq magent-store-magent--exported t)
  (magent-store-stop)
  (let* ((command (magent-store-magent--export-command))
         (reporter nil)
         (output (generate-new-buffer " *magent-store-export*"))
         (pending "")
         (process
          (make-process
           :name "magent-store-export" :command command :buffer output
           :connection-type 'pipe :noquery t :sentinel #'ignore
           :stderr (make-pipe-process
                    :name "magent-store-export-progress" :noquery t
                    :sentinel #'ignore
                    :filter
                    (lambda (_proc text)
                      (setq pending (concat pending text))
                      (while (string-match "\\`\\([^\n]*\\)\n" pending)
                        (let ((line (match-string 1 pending)))
                          (setq pending (substring pending (match-end 0)))
                          (when (string-match "\\`\\([0-9]+\\)/\\([0-9]+\\) " line)
                            (let ((done (string-to-number (match-string 1 line)))
                                  (total (string-to-number (match-string 2 line))))
                              (unless reporter
                                (setq reporter (make-progress-reporter
                                                "magent-store: writing sessions back..."
                                                0 total)))
                              (progress-reporter-update reporter done))))))))))
    (unwind-protect
        (progn
          (while (process-live-p process)
            (accept-process-output process 0.1))
          (when reporter (progress-reporter-done reporter))
          (let* ((lines (with-current-buffer output
                          (split-string (buffer-string) "\n" t)))
                 (summary (or (car (last lines)) "no output")))
            ;; Last, so that it stays in the echo area.
            (message "magent-store: %s%s; magent-store-mode is off: magent saves \
its own files again"
                     (if (zerop (process-exit-status process))
                         "" "export incomplete: ")
                     summary)
            summary))
      (kill-buffer output))))


(defun magent-store-magent--offer-export (interactive)
  "Say once that schema-7 sessions need an export for this magent.
When INTERACTIVE, offer to run it now."
  (when (and (not magent-store-magent--export-offered)
             (eql (magent-store-magent--schema) 6))
    (let ((count (length (magent-store-magent--schema7-headers))))
      (when (> count 0)
        (setq magent-store-magent--export-offered t)
        (let ((what (if (= count 1) "1 session is"
                      (format "%d sessions are" count))))
          (if (and interactive
                   (y-or-n-p (format "%s stored in a format this magent \
cannot read; write them back now? " what)))
              (magent-store-export-for-magent)
            (message "magent-store: %s stored in a format this magent cannot \
read; M-x magent-store-export-for-magent writes them back" what)))))))

(provide 'magent-store-magent-schema6)
;;; magent-store-magent-schema6.el ends here
