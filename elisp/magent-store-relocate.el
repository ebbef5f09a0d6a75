;;; magent-store-relocate.el --- Keep a project's magent sessions when it moves  -*- lexical-binding: t; -*-

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

;; magent keeps a project's sessions under a name made from the
;; project's folder: rename or move the folder and magent shows none of
;; them.  M-x magent-store-relocate asks for the project as it was (the
;; projects whose folder is gone come first) and where it is now, says
;; how many sessions will move and asks before moving them, then runs
;; `magent-store relocate' in its own process: Emacs stays free, and the
;; outcome is shown when it is done.  The command keeps a copy of every
;; session first, and refuses while one of them is open.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'magent-store)
(require 'magent-store-layout)
(require 'magent-store-program)

(defvar magent-store-relocate--process nil
  "The relocation process running now, or nil.")

(defconst magent-store-relocate-buffer "*magent-store relocate*"
  "Name of the buffer that shows what a relocation said.")

;;;; The projects under a session root

(defun magent-store-relocate--header-root (file)
  "Return the project root the session header FILE names, or nil."
  (condition-case nil
      (with-temp-buffer
        (insert-file-contents file)
        (let ((header (json-parse-buffer :object-type 'alist :null-object nil
                                         :false-object nil)))
          (and (equal (alist-get 'scope header) "project")
               (not (alist-get 'action header))
               (stringp (alist-get 'project-root header))
               (alist-get 'project-root header))))
    (error nil)))

(defun magent-store-relocate-projects (&optional root)
  "Return the projects with sessions under the session ROOT.
Each is (PROJECT-ROOT SESSIONS MISSING): the root as its sessions
name it, how many sessions it has, and whether its folder is gone.
Those whose folder is gone come first.  One header per project is
read; ROOT defaults to the one magent-store uses."
  (let ((found nil))
    (dolist (directory (magent-store-project-directories root))
      (let* ((headers (magent-store-session-headers directory))
             (project (cl-some #'magent-store-relocate--header-root headers)))
        (when project
          (push (list project (length headers)
                      (and (not (file-remote-p project))
                           (not (file-directory-p project))))
                found))))
    (sort found (lambda (a b)
                  (if (eq (not (nth 2 a)) (not (nth 2 b)))
                      (string< (car a) (car b))
                    (nth 2 a))))))

(defun magent-store-relocate--read-old (projects)
  "Read one of PROJECTS (see `magent-store-relocate-projects') by its root."
  (unless projects
    (user-error "No project sessions under %s" (magent-store-session-root)))
  (let* ((annotate
          (lambda (candidate)
            (when-let ((project (assoc candidate projects)))
              (format "  %d session%s%s" (nth 1 project)
                      (if (= (nth 1 project) 1) "" "s")
                      (if (nth 2 project) ", folder missing" "")))))
         (table
          (lambda (string predicate action)
            (if (eq action 'metadata)
                `(metadata (category . file)
                           (annotation-function . ,annotate)
                           (display-sort-function . identity)
                           (cycle-sort-function . identity))
              (complete-with-action action (mapcar #'car projects) string predicate)))))
    (completing-read "Move the sessions of project: " table nil t nil nil
                     (car (car projects)))))

;;;; Running the command

(defun magent-store-relocate--command (&rest args)
  "Return the backend command line followed by ARGS."
  (append (butlast (magent-store-program-command)) args))

;;;###autoload
(defun magent-store-relocate (old new &optional root)
  "Move the sessions of project OLD to the folder of project NEW.
OLD is the project's root as its sessions name it (its folder may be
gone), NEW its root now (it need not exist yet).  Asks before moving
anything, saying how many sessions move.  The move runs in a separate
process; its outcome is shown when it is done, and the process is
returned.  ROOT is the session root (default: the one magent-store
uses)."
  (interactive
   (let* ((projects (magent-store-relocate-projects))
          (old (magent-store-relocate--read-old projects))
          (new (read-directory-name (format "Move the sessions of %s to project: " old)
                                    (file-name-directory (directory-file-name old)))))
     (list old new)))
  (let* ((root (expand-file-name (or root (magent-store-session-root))))
         (new (directory-file-name (expand-file-name new)))
         (project (assoc old (magent-store-relocate-projects root))))
    (when (process-live-p magent-store-relocate--process)
      (user-error "A relocation is still running"))
    (unless project
      (user-error "No sessions of project %s under %s" old root))
    (when (equal (directory-file-name old) new)
      (user-error "That is where the sessions of %s already are" old))
    (unless (yes-or-no-p (format "Move %d session%s of %s to %s (a copy is kept first)? "
                                 (nth 1 project) (if (= (nth 1 project) 1) "" "s")
                                 old new))
      (user-error "Nothing moved"))
    ;; This Emacs's own sessions are closed (flushed first): its backend holds
    ;; none of them while they move.  Those another Emacs holds are refused.
    (magent-store-close-all)
    (let ((output (get-buffer-create magent-store-relocate-buffer)))
      (with-current-buffer output
        (let ((inhibit-read-only t))
          (erase-buffer)
          (special-mode)))
      (message "Moving the sessions of %s…" old)
      (setq magent-store-relocate--process
            (make-process
             :name "magent-store-relocate"
             :buffer output
             :command (magent-store-relocate--command "relocate" old new root)
             :connection-type 'pipe
             :noquery t
             :sentinel #'magent-store-relocate--sentinel)))))

(defun magent-store-relocate--unprefixed (line)
  "Return LINE without the \"magent-store: \" (and \"error: \") it begins with."
  (and line (replace-regexp-in-string "\\`magent-store: \\(?:error: \\)?" "" line)))

(defun magent-store-relocate--sentinel (process _event)
  "Say how PROCESS, a relocation, ended: in a message, and its buffer on failure."
  (unless (process-live-p process)
    (let* ((buffer (process-buffer process))
           (text (if (buffer-live-p buffer)
                     (with-current-buffer buffer (string-trim (buffer-string)))
                   ""))
           (last (magent-store-relocate--unprefixed
                  (car (last (split-string text "\n" t))))))
      (when (eq process magent-store-relocate--process)
        (setq magent-store-relocate--process nil))
      (if (eq (process-exit-status process) 0)
          (message "magent-store: %s" (or last "done"))
        (message "magent-store: the sessions were not moved: %s"
                 (or last (format "exit status %d" (process-exit-status process))))
        (when (buffer-live-p buffer)
          (display-buffer buffer))))))

(provide 'magent-store-relocate)
;;; magent-store-relocate.el ends here
