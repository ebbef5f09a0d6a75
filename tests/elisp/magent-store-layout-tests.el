;;; magent-store-layout-tests.el --- ERT: which file owns what, and what loads what  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The shim core (magent-store.el) knows nothing of magent and never
;; loads the adapter; every public command still works after
;; (require 'magent-store) alone, in a fresh `emacs -Q'; the adapter's
;; table lists every magent function any file of the package touches.

;;; Code:

(require 'cl-lib)
(require 'ert)

(defconst magent-store-layout-test--elisp
  (expand-file-name "../../elisp/"
                    (file-name-directory (or load-file-name buffer-file-name)))
  "The package's Lisp directory.")

(defun magent-store-layout-test--emacs (form)
  "Evaluate FORM in a fresh `emacs -Q' with the package on its path.
Return what FORM printed with `prin1', read back."
  (with-temp-buffer
    (let ((status
           (call-process
            (expand-file-name invocation-name invocation-directory) nil t nil
            "--batch" "-Q" "-L" magent-store-layout-test--elisp
            "--eval" (format "(prin1 %S)" form))))
      (should (eq status 0))
      (goto-char (point-max))
      (backward-sexp)
      (read (current-buffer)))))

(defun magent-store-layout-test--source (file)
  "Return FILE of the package's Lisp directory, without its comments.
Comments and docstrings speak of magent the program; code is what counts."
  (with-temp-buffer
    (insert-file-contents (expand-file-name file magent-store-layout-test--elisp))
    (emacs-lisp-mode)
    (goto-char (point-min))
    (let (forms)
      (condition-case nil
          (while t (push (read (current-buffer)) forms))
        (end-of-file nil))
      (nreverse forms))))

(defun magent-store-layout-test--symbols (tree)
  "Return every symbol in TREE that is not in a string."
  (let (found)
    (cl-labels ((walk (x)
                  (cond ((symbolp x) (push x found))
                        ((consp x) (walk (car x)) (walk (cdr x)))
                        ((vectorp x) (mapc #'walk x)))))
      (walk tree))
    (delete-dups found)))

(defun magent-store-layout-test--magent-p (symbol)
  "Non-nil when SYMBOL is one of magent's own names."
  (let ((name (symbol-name symbol)))
    (and (string-prefix-p "magent-" name)
         (not (string-prefix-p "magent-store" name)))))

(ert-deftest magent-store-core-names-nothing-of-magent ()
  "The shim core neither names a magent function or variable nor loads the adapter."
  (let ((symbols (magent-store-layout-test--symbols
                  (magent-store-layout-test--source "magent-store.el"))))
    (should-not (cl-remove-if-not #'magent-store-layout-test--magent-p symbols))
    (should-not (cl-remove-if-not
                 (lambda (s) (string-prefix-p "magent-store-magent"
                                              (symbol-name s)))
                 symbols))))

(ert-deftest magent-store-core-loads-alone-and-every-command-is-there ()
  "(require \\='magent-store) loads neither the adapter nor magent, and every
public command of the package is callable after it, as is the mode."
  (let ((seen (magent-store-layout-test--emacs
               '(progn
                  (require 'magent-store)
                  (list (featurep 'magent-store-magent)
                        (cl-remove-if
                         #'commandp
                         '(magent-store-mode magent-store-start magent-store-stop
                           magent-store-restart magent-store-status
                           magent-store-search magent-store-install-backend
                           magent-store-find-session magent-store-export-session
                           magent-store-timing-report
                           magent-store-export-for-magent magent-store-scan
                           magent-store-scrub magent-store-relocate
                           magent-store-idle-compact))
                        (fboundp 'magent-store-record-timing)
                        ;; Autoloaded: their files load at first use.
                        (cl-remove-if-not
                         #'featurep
                         '(magent-store-magent-schema6 magent-store-status
                           magent-store-search magent-store-scan
                           magent-store-find magent-store-timing
                           magent-store-idle magent-store-relocate)))))))
    (should (equal seen '(nil nil t nil))))
  ;; The mode loads the adapter, which finds the core already there.
  (should (equal (magent-store-layout-test--emacs
                  '(progn (require 'magent-store)
                          (magent-store-mode 1)
                          (list magent-store-mode
                                (featurep 'magent-store-magent)
                                (memq 'magent-store-magent--timing-sync
                                      magent-store-mode-hook)
                                (prog1 (memq 'magent-store-save-at-exit
                                             kill-emacs-hook)
                                  (magent-store-mode -1)))))
                 '(t t (magent-store-magent--timing-sync magent-store-idle--mode-changed)
                     (magent-store-save-at-exit))))
  ;; Loading the adapter first loads the core, once.
  (should (equal (magent-store-layout-test--emacs
                  '(progn (require 'magent-store-magent)
                          (list (featurep 'magent-store)
                                (fboundp 'magent-store-open))))
                 '(t t))))

(ert-deftest magent-store-adapter-table-lists-every-magent-function ()
  "Every magent function a file of the package declares, advises or calls
by name is a row of `magent-store-magent-functions'."
  (let* ((table (progn (require 'magent-store-magent)
                       (mapcar #'car (symbol-value
                                      'magent-store-magent-functions))))
         (touched nil))
    (dolist (file (directory-files magent-store-layout-test--elisp nil
                                   "\\`magent-store.*\\.el\\'"))
      (dolist (form (magent-store-layout-test--source file))
        (cl-labels
            ((walk (x)
               (when (consp x)
                 (pcase x
                   (`(declare-function ,(and f (pred symbolp)) . ,_)
                    (push f touched))
                   (`(,(or 'advice-add 'advice-remove) (quote ,f) . ,_)
                    (push f touched))
                   (`(,(or 'funcall 'fboundp) (quote ,f) . ,_)
                    (push f touched)))
                 (walk (car x)) (walk (cdr x)))))
          (walk form))))
    (should-not (sort (cl-set-difference
                       (cl-remove-if-not #'magent-store-layout-test--magent-p
                                         (delete-dups touched))
                       table)
                      #'string<))))

(provide 'magent-store-layout-tests)
;;; magent-store-layout-tests.el ends here
