;;; magent-store-program.el --- Finding the program that runs the magent-store backend  -*- lexical-binding: t; -*-

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

;; Which command runs the backend: `magent-store-python' when set, else
;; the virtualenv M-x magent-store-install-backend made, else the one of
;; the checkout or pip installation these Lisp files came from, else
;; `magent-store' on the variable `exec-path'.  When there is none, the
;; error says how to install it.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)

(defconst magent-store-program--directory
  (and load-file-name (file-name-directory load-file-name))
  "Directory this file was loaded from, to find a backend installed with it.")

(defcustom magent-store-backend-directory
  (locate-user-emacs-file "magent-store/venv/")
  "The private virtualenv `magent-store-install-backend' installs into."
  :type 'directory
  :group 'magent-store)

(defcustom magent-store-python nil
  "Command that runs the backend, without the \"serve\" argument.
A string (the program) or a list (the program and its first arguments),
e.g. (\"python3\" \"-m\" \"magent_store\").  nil means find it: the
virtualenv `magent-store-install-backend' made, else the virtualenv of a
checkout or pip installation these Lisp files came from, else
`magent-store' on the variable `exec-path'."
  :type '(choice (const :tag "Find it" nil)
                 (string :tag "Program")
                 (repeat :tag "Program and arguments" string))
  :group 'magent-store)

(defun magent-store-program--find ()
  "Return the backend program `magent-store-python' nil stands for, or nil."
  (or (cl-find-if
       #'file-executable-p
       (cons (expand-file-name "bin/magent-store"
                               magent-store-backend-directory)
             (and magent-store-program--directory
                  (list
                   ;; A checkout: elisp/ next to the .venv `make install' built.
                   (expand-file-name "../.venv/bin/magent-store"
                                     magent-store-program--directory)
                   ;; A pip installation: .../lib/pythonX.Y/site-packages/
                   ;; magent_store/elisp/, its program in .../bin/.
                   (expand-file-name "../../../../../bin/magent-store"
                                     magent-store-program--directory)))))
      (executable-find "magent-store")))

(defun magent-store-program ()
  "Return the backend command as a list (program and first arguments).
The program is nil when `magent-store-python' is nil and no backend
is installed."
  (cond ((null magent-store-python) (list (magent-store-program--find)))
        ((listp magent-store-python) magent-store-python)
        (t (list magent-store-python))))

(defun magent-store-program-stop (process)
  "Stop PROCESS, a run of `magent-store-program-run', unless it has ended.
Deleting a process runs its sentinel at once: whoever waits for it
forgets it first, or it is taken for a run that failed."
  (when (process-live-p process)
    (delete-process process)))

(defun magent-store-program-run (name args on-exit)
  "Run the backend's command line with ARGS in the background, as process NAME.
Its output (standard output and error, read as UTF-8) goes to a hidden
buffer; once it has exited, ON-EXIT is called with the process, that
output and the exit status, and the buffer is killed.  Return the
process."
  (let* ((command (append (butlast (magent-store-program-command)) args))
         (output (generate-new-buffer (format " *%s*" name))))
    (make-process
     :name name :buffer output :command command
     :coding 'utf-8 :connection-type 'pipe :noquery t
     :sentinel (lambda (process _event)
                 (unless (process-live-p process)
                   (unwind-protect
                       (funcall on-exit process
                                (if (buffer-live-p output)
                                    (with-current-buffer output (buffer-string))
                                  "")
                                (process-exit-status process))
                     (when (buffer-live-p output)
                       (kill-buffer output))))))))

(defun magent-store-program-command ()
  "Return the backend command as a list, ending in \"serve\".
Signal a `user-error' that says how to install the backend when
there is none."
  (let ((command (magent-store-program)))
    (unless (and (car command)
                 (if (file-name-absolute-p (car command))
                     (file-executable-p (car command))
                   (executable-find (car command))))
      (user-error "The magent-store backend is not installed%s: \
M-x magent-store-install-backend installs it"
                  (if (car command) (format " (no %s)" (car command)) "")))
    (append command (list "serve"))))

(provide 'magent-store-program)
;;; magent-store-program.el ends here
