;;; magent-store-layout.el --- Where a session root keeps each scope's sessions  -*- lexical-binding: t; -*-

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

;; A session root holds one directory per scope, as magent names them:
;; `global/', `projects/' and the SHA-1 of the project's root, and
;; `actions/' and the action's name, and in it each session's files:
;; its header `<id>.json' (what magent lists), its log `<id>.jsonl' and
;; its snapshot `<id>.snapshot'.  This is the one place on the Emacs side
;; that knows it (the backend's is layout.py); the adapter, the export
;; and relocate commands ask here.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'magent-store)

(defun magent-store-scope-directory (scope &optional root)
  "Return the directory holding the sessions of SCOPE under ROOT.
SCOPE is `global' (or nil), a project root, or (action . NAME), as
magent names it: `global/', `projects/' and the SHA-1 of the project
root, or `actions/' and the action's name with each run of characters
outside [[:alnum:]_.-] made one `-'.  ROOT defaults to the session root
magent-store uses.  With SCOPE `*', return every directory of ROOT that
holds sessions (a list), global's first."
  (let ((root (file-name-as-directory (or root (magent-store-session-root)))))
    (pcase scope
      ('* (cl-loop for pattern in '("global" "projects/*" "actions/*")
                   append (cl-remove-if-not
                           #'file-directory-p
                           (file-expand-wildcards (expand-file-name pattern root)))))
      ((or 'nil 'global "global") (expand-file-name "global" root))
      (`(action . ,name)
       (expand-file-name
        (concat "actions/" (replace-regexp-in-string
                            "[^[:alnum:]_.-]+" "-" (string-trim (format "%s" name))))
        root))
      ((pred stringp)
       (expand-file-name (concat "projects/" (secure-hash 'sha1 (expand-file-name scope)))
                         root))
      (_ (user-error "Invalid magent-store scope: %S" scope)))))

(defun magent-store-project-directories (&optional root)
  "Return the directories of ROOT holding a project's sessions, by name.
That is each directory in ROOT's `projects/', whose name is the SHA-1
of a project's root (see `magent-store-scope-directory').  ROOT
defaults to the session root magent-store uses."
  (let ((projects (expand-file-name "projects" (or root (magent-store-session-root)))))
    (and (file-directory-p projects)
         (cl-remove-if-not #'file-directory-p (directory-files projects t "\\`[^.]")))))

(defconst magent-store--session-suffixes
  '((header . ".json") (log . ".jsonl") (snapshot . ".snapshot"))
  "Each kind of a session's files, with the suffix its name adds to the id.")

(defun magent-store-session-headers (directory)
  "Return the session headers in DIRECTORY, a scope's directory, by name.
A header is a session's `<id>.json', the file magent lists."
  (directory-files directory t
                   (concat (regexp-quote
                            (alist-get 'header magent-store--session-suffixes))
                           "\\'")))

(defun magent-store-session-file (kind id directory)
  "Return the file of KIND of the session ID in DIRECTORY, a scope's directory.
KIND is `header' (`<id>.json', the file magent lists), `log'
\(`<id>.jsonl', the events) or `snapshot' (`<id>.snapshot', the thread
as of its last compaction)."
  (let ((suffix (alist-get kind magent-store--session-suffixes)))
    (unless suffix
      (error "Invalid session file kind: %S" kind))
    (expand-file-name (concat id suffix) directory)))

(provide 'magent-store-layout)
;;; magent-store-layout.el ends here
