;;; magent-store-install.el --- Install the magent-store backend from Emacs  -*- lexical-binding: t; -*-

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

;; M-x magent-store-install-backend creates a private virtualenv
;; (`magent-store-backend-directory', under `user-emacs-directory') and
;; installs into it the backend that came with this package: the package
;; carries the backend's Python source next to its Lisp files.  It runs
;; asynchronously, its output in the *magent-store-install* buffer, the
;; way jedi.el's `jedi:install-server' or elpy's RPC virtualenv do.  Once
;; it is done, `magent-store-start' finds the backend there by itself.
;;
;; It needs Python 3.11 or later (`magent-store-install-python') with its
;; venv module (Debian: apt-get install python3-venv), and the network to
;; fetch the backend's dependencies from the Python package index.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'magent-store)

(defcustom magent-store-install-python "python3"
  "The Python (3.11 or later) that creates the backend's virtualenv."
  :type 'string
  :group 'magent-store)

(defcustom magent-store-install-pip-arguments nil
  "Extra arguments for pip install, e.g. (\"--index-url\" \"URL\")."
  :type '(repeat string)
  :group 'magent-store)

(defconst magent-store-install--buffer "*magent-store-install*"
  "Where the installation's output goes.")

(defconst magent-store-install--directory
  (and load-file-name (file-name-directory load-file-name))
  "Directory this file was loaded from.")

(defvar magent-store-install--process nil
  "The installation step running now, or nil.")

(defvar-local magent-store-install--killed nil
  "Non-nil in the output buffer once it is being killed.")

(defun magent-store-install--stopped-p (buffer)
  "Return non-nil when BUFFER, the output buffer, was killed or is being killed."
  (or (not (buffer-live-p buffer))
      (buffer-local-value 'magent-store-install--killed buffer)))

(defun magent-store-install--kill-step ()
  "Stop the installation step running, its output buffer being killed.
Killing a buffer only sends its process a hangup, which a process may
ignore (one started from a batch Emacs run under nohup does): it is killed."
  (setq magent-store-install--killed t)
  (when (and (process-live-p magent-store-install--process)
             (eq (process-buffer magent-store-install--process) (current-buffer)))
    (delete-process magent-store-install--process)))

(defun magent-store-install--source ()
  "Return the directory holding the backend's source (pyproject.toml).
A package from an archive has it next to the Lisp files; a checkout,
one level up."
  (let ((here (or magent-store-install--directory default-directory)))
    (or (cl-find-if (lambda (dir)
                      (and (file-readable-p (expand-file-name "pyproject.toml" dir))
                           (file-directory-p (expand-file-name "backend" dir))))
                    (list here (expand-file-name ".." here)))
        (user-error "The backend's source is not next to %s: \
install magent-store from its package or a checkout (or pip install magent-store)"
                    here))))

(defun magent-store-install--lisp-files (source)
  "Return this package's Lisp files, found in SOURCE or SOURCE/elisp."
  (let ((dir (if (file-exists-p (expand-file-name "elisp/magent-store.el" source))
                 (expand-file-name "elisp" source)
               source)))
    (cl-remove-if (lambda (file)
                    (string-match-p "-\\(?:autoloads\\|pkg\\)\\.el\\'" file))
                  (directory-files dir t "\\`magent-store.*\\.el\\'"))))

(defun magent-store-install--stage (source)
  "Copy the backend's source from SOURCE into a fresh directory; return it.
pip builds from a copy laid out as the project is (the Lisp files in
elisp/, which the Python package carries too), whatever the layout the
package archive gave SOURCE; nothing is written into SOURCE."
  (let ((stage (make-temp-file "magent-store-install-" t)))
    (dolist (file '("pyproject.toml" "README.md" "LICENSE"))
      (let ((from (expand-file-name file source)))
        (if (file-exists-p from)
            (copy-file from (expand-file-name file stage))
          (delete-directory stage t)
          (user-error "The backend's source in %s lacks %s" source file))))
    (make-directory (expand-file-name "backend" stage))
    (copy-directory (expand-file-name "backend/magent_store" source)
                    (expand-file-name "backend/magent_store" stage) nil nil nil)
    (dolist (dir (directory-files-recursively stage "\\`__pycache__\\'" t))
      (delete-directory dir t))
    (make-directory (expand-file-name "elisp" stage))
    (dolist (file (magent-store-install--lisp-files source))
      (copy-file file (expand-file-name (file-name-nondirectory file)
                                        (expand-file-name "elisp" stage))))
    stage))

(defun magent-store-install--commands (stage)
  "Return how to install the backend staged in STAGE.
That is a list of (WHAT-FAILED . COMMAND), WHAT-FAILED being what to
tell the user if COMMAND fails."
  (let ((venv (directory-file-name
               (expand-file-name magent-store-backend-directory))))
    (list (cons (format "%s is not Python 3.11 or later (see \
`magent-store-install-python')" magent-store-install-python)
                (list magent-store-install-python "-c"
                      "import sys, venv; sys.exit(sys.version_info < (3, 11) \
and 'magent-store needs Python 3.11 or later, this is ' \
+ sys.version.split()[0])"))
          (cons "the virtualenv could not be made (on Debian, install \
python3-venv)"
                (list magent-store-install-python "-m" "venv" venv))
          (cons "pip could not install the backend or its dependencies \
\(is the Python package index reachable?)"
                (append (list (expand-file-name "bin/python" venv) "-m" "pip"
                              "install" "--disable-pip-version-check")
                        magent-store-install-pip-arguments
                        (list stage))))))

(defconst magent-store-install--stopped
  "the installation was stopped: its buffer was killed"
  "What failed, when the output buffer was killed mid-installation.")

(defun magent-store-install--run (commands buffer done)
  "Run COMMANDS in turn, their output in BUFFER; then call DONE.
COMMANDS are (WHAT-FAILED . COMMAND).  DONE gets nil on success,
else the WHAT-FAILED of the command that failed."
  (cond
   ((null commands) (funcall done nil))
   ((magent-store-install--stopped-p buffer) (funcall done magent-store-install--stopped))
   (t
    (let ((command (cdar commands))
          (what-failed (caar commands)))
      (with-current-buffer buffer
        (let ((inhibit-read-only t))
          (goto-char (point-max))
          (insert "$ " (mapconcat #'shell-quote-argument command " ") "\n")))
      (setq magent-store-install--process
            (make-process
             :name "magent-store-install"
             :buffer buffer
             :command command
             :connection-type 'pipe
             :noquery t
             :sentinel
             (lambda (process _event)
               (unless (process-live-p process)
                 (setq magent-store-install--process nil)
                 (cond
                  ;; Killing the buffer killed its process too.
                  ((magent-store-install--stopped-p buffer)
                   (funcall done magent-store-install--stopped))
                  ((and (eq (process-status process) 'exit)
                        (zerop (process-exit-status process)))
                   (magent-store-install--run (cdr commands) buffer done))
                  (t (funcall done what-failed)))))))))))

;;;###autoload
(defun magent-store-install-backend (&optional callback)
  "Install the backend into a private virtualenv, asynchronously.
The virtualenv is `magent-store-backend-directory', made with
`magent-store-install-python'; the backend installed is the one that
came with this package.  Output goes to the *magent-store-install*
buffer.  When it is done, call CALLBACK (if non-nil) with nil on
success or a string saying what failed."
  (interactive)
  (when (process-live-p magent-store-install--process)
    (user-error "The magent-store backend is being installed; see %s"
                magent-store-install--buffer))
  (unless (executable-find magent-store-install-python)
    (user-error "Installing the magent-store backend needs Python 3.11 or \
later: no %s on `exec-path' (see `magent-store-install-python')"
                magent-store-install-python))
  (let* ((source (magent-store-install--source))
         (stage (magent-store-install--stage source))
         (buffer (get-buffer-create magent-store-install--buffer))
         (venv (expand-file-name magent-store-backend-directory)))
    (with-current-buffer buffer
      (let ((inhibit-read-only t))
        (erase-buffer)
        (insert (format "Installing the magent-store backend %s from %s\n\
into %s\n\n" magent-store-version source venv)))
      (special-mode)
      ;; After the mode, which clears local hooks.
      (add-hook 'kill-buffer-hook #'magent-store-install--kill-step nil t))
    (when (called-interactively-p 'interactive)
      (display-buffer buffer))
    (magent-store-install--run
     (magent-store-install--commands stage) buffer
     (lambda (failure)
       (ignore-errors (delete-directory stage t))
       (let ((text (cond
                    ((magent-store-install--stopped-p buffer)
                     (format "magent-store: installing the backend failed: %s"
                             failure))
                    (failure
                     (format "magent-store: installing the backend failed: \
%s; see %s" failure magent-store-install--buffer))
                    (t (format "magent-store: the backend is installed in %s"
                               venv)))))
         (unless (magent-store-install--stopped-p buffer)
           (with-current-buffer buffer
             (let ((inhibit-read-only t))
               (goto-char (point-max))
               (insert "\n" text "\n"))))
         (message "%s" text))
       (when callback (funcall callback failure))))
    buffer))

(provide 'magent-store-install)
;;; magent-store-install.el ends here
