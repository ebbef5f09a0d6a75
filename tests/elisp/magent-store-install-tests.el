;;; magent-store-install-tests.el --- ERT: the backend installs itself, versions are checked  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store-install-backend' for real: a package directory laid out
;; as the MELPA recipe (recipes/magent-store) lays it out, a temporary
;; `user-emacs-directory', python3 -m venv and pip install from the
;; package index (about 30 s), then `magent-store-start' finds the new
;; backend and a session round-trips through it.  The only stand-in is
;; the user's answer to the y-or-n-p that offers the installation.  When
;; the package index cannot be reached (Emacs 30's chroot here trusts no
;; proxy certificate), the test is skipped and says why.

;;; Code:

(require 'cl-lib)
(require 'ert)

(require 'magent-store-test-backend)
(require 'magent-store)
(require 'magent-store-install)

(defconst magent-store-install-test--checkout
  (expand-file-name ".." (file-name-directory
                          (directory-file-name
                           (file-name-directory
                            (or load-file-name buffer-file-name)))))
  "The checkout these tests belong to.")

(defun magent-store-install-test--package (dir)
  "Lay out in DIR the package the MELPA recipe describes; return DIR.
Each entry of the recipe's :files is a glob copied to the top level,
or a directory copied whole, as package-build does."
  (let* ((recipe (with-temp-buffer
                   (insert-file-contents
                    (expand-file-name "recipes/magent-store"
                                      magent-store-install-test--checkout))
                   (read (current-buffer))))
         (default-directory magent-store-install-test--checkout))
    (make-directory dir t)
    (dolist (spec (plist-get (cdr recipe) :files))
      (dolist (file (file-expand-wildcards spec))
        (let ((to (expand-file-name (file-name-nondirectory file) dir)))
          (if (file-directory-p file)
              (copy-directory file to nil nil nil)
            (copy-file file to)))))
    dir))

(defun magent-store-install-test--without-backends (path)
  "Return PATH without the directories that hold a magent-store program."
  (cl-remove-if (lambda (dir)
                  (file-executable-p (expand-file-name "magent-store" dir)))
                path))

(defun magent-store-install-test--python ()
  "Return a Python 3.11+ for the virtualenv: python3, else the tests' own.
The tests' own is the one `make install' built .venv with (Emacs 30's
chroot here has no python3 of its own)."
  (or (executable-find "python3")
      (let ((cfg (expand-file-name ".venv/pyvenv.cfg"
                                   magent-store-install-test--checkout)))
        (and (file-readable-p cfg)
             (with-temp-buffer
               (insert-file-contents cfg)
               (and (re-search-forward "^home = \\(.*\\)$" nil t)
                    (expand-file-name "python3" (match-string 1))))))
      "python3"))

(defun magent-store-install-test--index-unreachable (python)
  "Return why PYTHON cannot reach the Python package index, or nil."
  (with-temp-buffer
    (unless (eq 0 (call-process
                   python nil t nil "-c"
                   "import urllib.request as u; u.urlopen('https://pypi.org/simple/pip/', timeout=20)"))
      (string-trim (buffer-substring (max (point-min) (- (point-max) 300))
                                     (point-max))))))

(defun magent-store-install-test--found-from (elisp tmp)
  "Return the backend program a fresh Emacs finds, loading the shim from ELISP.
It has no backend on PATH, and its `user-emacs-directory' (no virtualenv
of the installer's) is under TMP."
  (let ((process-environment
         (cons (concat "PATH=" (mapconcat #'identity
                                          (magent-store-install-test--without-backends
                                           (split-string (or (getenv "PATH") "") ":" t))
                                          ":"))
               process-environment)))
    (with-temp-buffer
      (call-process
       (expand-file-name invocation-name invocation-directory) nil '(t nil) nil
       "--batch" "-Q" "-L" elisp
       "--eval" (format "(setq user-emacs-directory %S)"
                        (file-name-as-directory (expand-file-name "fresh.d" tmp)))
       "--eval" "(progn (require 'magent-store-program) (princ (car (magent-store-program))))")
      (buffer-string))))

(ert-deftest magent-store-install-backend-from-the-package-then-start ()
  "No backend: start offers the installation, which makes a virtualenv
under `user-emacs-directory'; the backend then starts from there."
  (magent-store-test-with-backend
      ((user-emacs-directory (file-name-as-directory
                              (expand-file-name "emacs.d" tmp)))
       (magent-store-backend-directory
        (eval (car (get 'magent-store-backend-directory 'standard-value)) t))
       (magent-store-install--directory
        (magent-store-install-test--package
         (expand-file-name "elpa/magent-store-0.1.0/" tmp)))
       ;; As if loaded from the package: no checkout .venv beside it.
       (magent-store-program--directory magent-store-install--directory)
       (magent-store-install-python (magent-store-install-test--python))
       (exec-path (magent-store-install-test--without-backends exec-path))
       (magent-store-python nil)
       (offered nil))
    (when-let ((why (magent-store-install-test--index-unreachable
                     magent-store-install-python)))
      (ert-skip (format "the Python package index is not reachable: %s" why)))
    (unwind-protect
        (progn
          (should (string-prefix-p user-emacs-directory
                                   magent-store-backend-directory))
          ;; Missing, the backend is named with the way to install it.
          (should (equal (magent-store-program) '(nil)))
          (should (string-match-p
                   "not installed.*M-x magent-store-install-backend"
                   (cadr (should-error (magent-store-program-command)
                                       :type 'user-error))))
          (cl-letf (((symbol-function 'y-or-n-p)
                     (lambda (prompt) (setq offered prompt) t)))
            (should-not (magent-store-start t)))
          (should (string-match-p "not installed" offered))
          ;; Until the last step's sentinel said how it ended (and then
          ;; started the backend): a step's process is gone before its last
          ;; output is read, and pip's own lines hold "magent-store: " too.
          (let ((deadline (+ (float-time) 600)))
            (while (and (< (float-time) deadline)
                        (not (with-current-buffer magent-store-install--buffer
                               (save-excursion
                                 (goto-char (point-min))
                                 (re-search-forward "^magent-store: \\(?:the \
backend is installed\\|installing the backend failed\\)" nil t)))))
              (accept-process-output nil 0.2)))
          (with-current-buffer magent-store-install--buffer
            (should (string-match-p "Successfully installed.*magent-store-0.1.0"
                                    (buffer-string))))
          (let ((program (expand-file-name "bin/magent-store"
                                           magent-store-backend-directory)))
            (should (file-executable-p program))
            (should (equal (magent-store-program) (list program)))
            ;; The installed backend carries this package's Lisp files, and
            ;; they, loaded from there, find it in the pip installation's
            ;; layout: no virtualenv of the installer's, none on PATH.
            (let ((elisp (string-trim
                          (with-output-to-string
                            (call-process program nil standard-output nil
                                          "elisp-dir")))))
              (should (file-exists-p (expand-file-name "magent-store.el" elisp)))
              (should (equal (magent-store-install-test--found-from elisp tmp)
                             program))))
          (should magent-store-current-backend)
          (should (equal (car (process-command (magent-store-backend-process
                                                magent-store-current-backend)))
                         (expand-file-name "bin/magent-store"
                                           magent-store-backend-directory)))
          (should-not magent-store-last-error)  ; versions agree
          (magent-store-open "s1")
          (magent-store-put-header "s1" '((id . "s1") (schema-version . 7)))
          (magent-store-flush "s1")
          (should (file-exists-p (expand-file-name "global/s1.json"
                                                   magent-store-root))))
      (ignore-errors (magent-store-stop))
      (when (process-live-p magent-store-install--process)
        (delete-process magent-store-install--process)))))

(ert-deftest magent-store-install-source-is-the-package-wherever-emacs-is ()
  "The backend's source is found next to the Lisp files, whatever the
current directory; a directory with pyproject.toml but no backend/ is
not it."
  (let* ((tmp (make-temp-file "magent-store-install-test-" t))
         (package (magent-store-install-test--package
                   (expand-file-name "elpa/magent-store-0.1.0/" tmp)))
         (default-directory (file-name-as-directory tmp)))
    (unwind-protect
        (progn
          (let ((magent-store-install--directory package))
            (should (equal (magent-store-install--source) package)))
          (let* ((half (expand-file-name "half/lisp/" tmp))
                 (magent-store-install--directory half))
            (make-directory half t)
            (with-temp-file (expand-file-name "pyproject.toml" half))
            (should (string-match-p
                     "source is not next to"
                     (cadr (should-error (magent-store-install--source)
                                         :type 'user-error))))))
      (delete-directory tmp t))))

(ert-deftest magent-store-install-a-failed-step-stops-and-says-so ()
  "A step that fails stops the installation: the callback and the output
buffer say it failed.  While a step runs, a second installation is
refused.  Run as a command, it shows its output; run from Lisp (as
starting the backend runs it), it shows nothing."
  (let* ((tmp (make-temp-file "magent-store-install-test-" t))
         (python (expand-file-name "python" tmp))
         (magent-store-install-python python)
         (magent-store-backend-directory (expand-file-name "venv" tmp))
         (failure :not-yet))
    (unwind-protect
        (progn
          ;; A "Python" that waits for its input, then fails: the test says
          ;; when the step ends.
          (with-temp-file python (insert "#!/bin/sh\nread line\nexit 3\n"))
          (set-file-modes python #o700)
          (let ((buffer (save-window-excursion
                          ;; As when typed: batch Emacs counts no call as interactive otherwise.
                          (let ((noninteractive nil))
                            (should (get-buffer-window
                                     (call-interactively #'magent-store-install-backend))))
                          (process-send-eof magent-store-install--process)
                          (with-timeout (30 (error "The failed step was never reported"))
                            (while magent-store-install--process
                              (accept-process-output nil 0.05)))
                          (magent-store-install-backend (lambda (why) (setq failure why))))))
            (should-not (get-buffer-window buffer))
            (should (process-live-p magent-store-install--process))
            (should (string-match-p
                     "being installed"
                     (cadr (should-error (magent-store-install-backend)
                                         :type 'user-error)))))
          (process-send-eof magent-store-install--process)
          (with-timeout (30 (error "The failed step was never reported"))
            (while (eq failure :not-yet)
              (accept-process-output nil 0.05)))
          (should (stringp failure))
          (should-not magent-store-install--process)
          (with-current-buffer magent-store-install--buffer
            (should (string-match-p "^magent-store: installing the backend failed: "
                                    (buffer-string)))))
      (when (process-live-p magent-store-install--process)
        (delete-process magent-store-install--process))
      (setq magent-store-install--process nil)
      (delete-directory tmp t))))

(ert-deftest magent-store-install-killing-its-buffer-stops-it-and-says-so ()
  "Killing the output buffer mid-installation stops the installation: the
callback and the echo area say so, no error is raised, and a new
installation can start."
  (let* ((tmp (make-temp-file "magent-store-install-test-" t))
         (python (expand-file-name "python" tmp))
         (magent-store-install-python python)
         (magent-store-backend-directory (expand-file-name "venv" tmp))
         (failure :not-yet)
         (said nil)
         (record (lambda (format &rest args)
                   (when format (push (apply #'format-message format args) said)))))
    (advice-add 'message :before record)
    (unwind-protect
        (progn
          ;; A "Python" that waits for its input, deaf to the hangup
          ;; killing a buffer sends (as in an Emacs started under nohup):
          ;; still running when the buffer goes.
          (with-temp-file python (insert "#!/bin/sh\ntrap '' HUP\nread line\nexit 0\n"))
          (set-file-modes python #o700)
          (let* ((buffer (magent-store-install-backend (lambda (why) (setq failure why))))
                 (step magent-store-install--process))
            (should (process-live-p step))
            (kill-buffer buffer)
            (should-not (process-live-p step)))
          (with-timeout (30 (error "The stopped installation was never reported"))
            (while (eq failure :not-yet)
              (accept-process-output nil 0.05)))
          (should (equal failure "the installation was stopped: its buffer was killed"))
          (should-not magent-store-install--process)
          (should (member (concat "magent-store: installing the backend failed: "
                                  "the installation was stopped: its buffer was killed")
                          said))
          (should-not (cl-find-if (lambda (m) (string-match-p "error in process" m)) said))
          (should-not (get-buffer magent-store-install--buffer)))
      (advice-remove 'message record)
      (when (process-live-p magent-store-install--process)
        (delete-process magent-store-install--process))
      (setq magent-store-install--process nil)
      (delete-directory tmp t))))

(ert-deftest magent-store-version-mismatch-is-said-at-start ()
  "A backend of another version starts, and the user is told which."
  (magent-store-test-with-backend ((magent-store-version "0.0.1-other")
                                   (warning-minimum-log-level :emergency))
    (magent-store-start)
    (should magent-store-current-backend)
    (should (string-match-p
             "is version 0\\.1\\.0, this package is version 0\\.0\\.1-other: M-x magent-store-install-backend"
             magent-store-last-error))))

(provide 'magent-store-install-tests)
;;; magent-store-install-tests.el ends here
