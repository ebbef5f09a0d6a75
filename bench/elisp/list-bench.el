;;; list-bench.el --- One run of magent's session listing, for bench/list_bench.py  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; In a fresh Emacs: upstream magent's real listing
;; (`magent-session-list-files', what its picker and ACP's session list
;; call) of the root LIST_BENCH_ROOT, twice, then magent's read of the
;; newest session (a resume).  LIST_BENCH_MODE is "own" (magent's own
;; schema-6 files, the mode off) or "store" (the mode on, its backend
;; not started yet: the first listing starts it).  Prints one JSON line:
;; the seconds of each, how many sessions were listed, the Emacs version.
;; bench/list_bench.py runs it; MAGENT_LISP names magent's lisp/ folder.

;;; Code:

(require 'cl-lib)
(require 'json)
(require 'magent-store-test-upstream)
(unless (locate-library "epc")
  (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path dir)))
(magent-store-test-upstream-load)
(require 'magent-agent-job)

(defvar magent-session-directory)
(defvar magent-store-python)

(defun list-bench--seconds (thunk)
  "Return (VALUE . SECONDS) of calling THUNK."
  (let ((start (float-time)))
    (let ((value (funcall thunk)))
      (cons value (- (float-time) start)))))

(let ((store (equal (getenv "LIST_BENCH_MODE") "store")))
  (setq magent-session-directory (getenv "LIST_BENCH_ROOT"))
  (when store
    (require 'magent-store)
    (setq magent-store-python (getenv "LIST_BENCH_BACKEND"))
    (magent-store-mode 1))
  (garbage-collect)
  (let* ((first (list-bench--seconds #'magent-session-list-files))
         (second (list-bench--seconds #'magent-session-list-files))
         (resume (progn
                   (garbage-collect)  ; the resume pays for its own garbage only
                   (list-bench--seconds
                    (lambda () (magent-session-read-file (car (car first))))))))
    (unless (plist-get (car resume) :session)
      (error "The resumed session %s was not read" (car (car first))))
    (princ (concat (json-encode `((first . ,(cdr first))
                                  (second . ,(cdr second))
                                  (resume . ,(cdr resume))
                                  (count . ,(length (car first)))
                                  (emacs . ,emacs-version)))
                   "\n")))
  (when store
    (magent-store-mode -1)
    (magent-store-stop)))

;;; list-bench.el ends here
