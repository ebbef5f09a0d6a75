;;; elisp-record.el --- Which ERT test reaches which function  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Loaded (-l) before the test files by `make mutation-elisp''s recording
;; run, as mutmut records which test calls which function.  Every function
;; named in the file MAGENT_STORE_MUTATION_FUNCTIONS (one a line) is
;; advised, as soon as the file defining it is loaded, to note the test
;; running when it is called: a call from a timer or a process filter
;; while a test waits counts for that test, and a call outside any test
;; (while the files load) counts as `:load'.  When Emacs exits, each
;; function and test reached is written, one pair a line ("FUNCTION TEST"),
;; to the file MAGENT_STORE_MUTATION_RECORD.

;;; Code:

(require 'ert)

(defvar elisp-record--functions
  (with-temp-buffer
    (insert-file-contents (getenv "MAGENT_STORE_MUTATION_FUNCTIONS"))
    (mapcar #'intern (split-string (buffer-string) "\n" t "[ \t]+")))
  "The functions to watch.")

(defvar elisp-record--reached (make-hash-table :test #'equal)
  "Keys (FUNCTION . TEST) for each test that reached each function.")

(defun elisp-record--noter (function)
  "Return advice noting that FUNCTION was called, and in which test."
  (lambda (&rest _)
    (let ((test (car ert--running-tests)))
      (puthash (cons function (if test (ert-test-name test) :load)) t
               elisp-record--reached))))

(defun elisp-record--advise (&rest _)
  "Advise every watched function that is defined and not yet advised."
  (dolist (function elisp-record--functions)
    (when (and (fboundp function)
               (not (macrop function))
               (not (autoloadp (symbol-function function)))
               (not (get function 'elisp-record--advised)))
      (put function 'elisp-record--advised t)
      (advice-add function :before (elisp-record--noter function)))))

(defun elisp-record--write ()
  "Write what was reached to MAGENT_STORE_MUTATION_RECORD."
  (with-temp-file (getenv "MAGENT_STORE_MUTATION_RECORD")
    (maphash (lambda (key _)
               (insert (format "%s %s\n" (car key) (cdr key))))
             elisp-record--reached)))

(add-hook 'after-load-functions #'elisp-record--advise)
(add-hook 'kill-emacs-hook #'elisp-record--write)
(elisp-record--advise)

(provide 'elisp-record)
;;; elisp-record.el ends here
