;;; magent-store-lint.el --- What MELPA checks, for `make lint'  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; emacs --batch -Q -l tests/elisp/magent-store-lint.el \
;;   -f magent-store-lint-batch-and-exit elisp/*.el
;;
;; Runs package-lint (the first file's directory holding the main file,
;; magent-store.el), checkdoc and `lm-verify' on every file named, prints
;; every finding as FILE:LINE: WHAT and exits non-zero if there was one.
;; Warnings count: MELPA's reviewers read them.  package-lint comes from
;; Debian's elpa-package-lint (MELPA is not reachable from CI).

;;; Code:

(require 'cl-lib)
(require 'checkdoc)
(require 'lisp-mnt)

(dolist (dir (file-expand-wildcards
              "/usr/share/emacs/site-lisp/elpa/package-lint-[0-9]*"))
  (add-to-list 'load-path dir))

(defconst magent-store-lint--stale-warning
  "This makes the package uninstallable in all released Emacs versions."
  "What an old package-lint says of a requirement newer than it knows.
Debian 12's package-lint (0.16) says it of Emacs 28.1, which it runs
on: the finding is dropped when the running Emacs meets the requirement.")

(defun magent-store-lint--package-lint (file main)
  "Return package-lint's findings on FILE, MAIN being the main file."
  (with-temp-buffer
    (insert-file-contents file t)
    (emacs-lisp-mode)
    (let ((package-lint-main-file main)
          (emacs-required (car (alist-get 'emacs (magent-store-lint--requires
                                                  main))))
          findings)
      (pcase-dolist (`(,line ,_col ,type ,message) (package-lint-buffer))
        (unless (and (equal message magent-store-lint--stale-warning)
                     emacs-required
                     (version<= emacs-required emacs-version))
          (push (format "%s:%d: package-lint %s: %s"
                        (file-name-nondirectory file) line type message)
                findings)))
      (nreverse findings))))

(defun magent-store-lint--requires (file)
  "Return FILE's Package-Requires as a list of (NAME VERSION)."
  (with-temp-buffer
    (insert-file-contents file)
    (let ((text (lm-header "Package-Requires")))
      (and text (car (read-from-string text))))))

(defun magent-store-lint--archive-from-installed ()
  "Let package-lint see installed packages as installable.
MELPA is not reachable here: Debian's elpa-* packages (epc and its
dependencies, the same releases MELPA stable has) stand in for it."
  (dolist (entry package-alist)
    (unless (assq (car entry) package-archive-contents)
      (push (cons (car entry) (cdr entry)) package-archive-contents))))

(defun magent-store-lint--checkdoc (file)
  "Return checkdoc's findings on FILE."
  (let (findings)
    (cl-letf* ((original (symbol-function 'checkdoc-error))
               ((symbol-function 'checkdoc-error)
                (lambda (point msg)
                  (push (format "%s:%d: checkdoc: %s"
                                (file-name-nondirectory file)
                                (line-number-at-pos point) msg)
                        findings)
                  (let ((inhibit-message t))
                    (funcall original point msg)))))
      ;; No version control: visiting the file needs no git.
      (with-current-buffer (let ((vc-handled-backends nil))
                             (find-file-noselect file))
        (let ((checkdoc-diagnostic-buffer " *magent-store-lint*"))
          (checkdoc-current-buffer t))
        (kill-buffer)))
    (nreverse findings)))

(defun magent-store-lint--lm-verify (file)
  "Return `lm-verify's finding on FILE as a list (empty when it is fine)."
  (let ((problem (lm-verify file nil nil t)))
    (and problem
         (list (format "%s: lm-verify: %s" (file-name-nondirectory file)
                       problem)))))

(defun magent-store-lint-batch-and-exit ()
  "Lint the files left on the command line; exit 1 if anything was found."
  (unless (require 'package-lint nil t)
    (message "make lint needs package-lint: apt-get install elpa-package-lint \
\(Debian), or M-x package-install RET package-lint (MELPA)")
    (kill-emacs 2))
  (require 'package)
  ;; Debian's packages live here; `emacs -Q' does not know it.
  (add-to-list 'package-directory-list "/usr/share/emacs/site-lisp/elpa")
  (package-initialize)
  (magent-store-lint--archive-from-installed)
  (let* ((files (mapcar #'expand-file-name command-line-args-left))
         (main (expand-file-name
                "magent-store.el" (file-name-directory (car files))))
         (findings
          (cl-mapcan (lambda (file)
                       (append (magent-store-lint--package-lint file main)
                               (magent-store-lint--checkdoc file)
                               (magent-store-lint--lm-verify file)))
                     files)))
    (setq command-line-args-left nil)
    (dolist (finding findings) (message "%s" finding))
    (message "lint: %d file(s), %d finding(s)" (length files) (length findings))
    (kill-emacs (if findings 1 0))))

(provide 'magent-store-lint)
;;; magent-store-lint.el ends here
