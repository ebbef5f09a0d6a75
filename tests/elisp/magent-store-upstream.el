;;; magent-store-upstream.el --- Load upstream magent for integration tests  -*- lexical-binding: t; -*-

;;; Commentary:

;; The integration tests run against magent's own code, never a copy of it:
;; MAGENT_LISP names upstream magent's lisp/ folder (see the README for
;; how to get it).  Optionally MAGENT_SESSION7 names a folder holding a
;; newer magent-session.el that reads schema 7 itself; it is loaded over
;; the release's.  When gptel is not installed, tests/elisp/stubs stands in
;; for it (magent only requires it at load time; the tests never call it).

;;; Code:

(require 'cl-lib)
(require 'subr-x)

(defconst magent-store-upstream-lisp
  (let ((dir (getenv "MAGENT_LISP")))
    (and dir (not (string-empty-p dir)) (file-name-as-directory
                                           (expand-file-name dir))))
  "Upstream magent's lisp/ folder, from MAGENT_LISP, or nil.")

(defconst magent-store-upstream-session7
  (let ((dir (getenv "MAGENT_SESSION7")))
    (and dir (not (string-empty-p dir)) (file-name-as-directory
                                           (expand-file-name dir))))
  "Folder of a schema-7 magent-session.el, from MAGENT_SESSION7, or nil.")

(defconst magent-store-upstream--stubs
  (expand-file-name "stubs" (file-name-directory
                             (or load-file-name buffer-file-name)))
  "Stand-ins for packages magent requires that cannot be installed here.")

(defun magent-store-upstream-available-p ()
  "Return non-nil when upstream magent's code can be loaded."
  (and magent-store-upstream-lisp
       (file-readable-p (expand-file-name "magent-ledger.el"
                                          magent-store-upstream-lisp))))

(defun magent-store-upstream-load (&optional schema7)
  "Load upstream magent's ledger and session modules.
With SCHEMA7, load the schema-7 magent-session.el over the release's
\(signal an error when MAGENT_SESSION7 is not set)."
  (unless (magent-store-upstream-available-p)
    (error "MAGENT_LISP does not name upstream magent's lisp/ folder"))
  (add-to-list 'load-path magent-store-upstream-lisp)
  (unless (locate-library "gptel")
    (add-to-list 'load-path magent-store-upstream--stubs t))
  (require 'magent-ledger)
  (require 'magent-session)
  (when schema7
    (unless magent-store-upstream-session7
      (error "MAGENT_SESSION7 is not set"))
    (load (expand-file-name "magent-session.el" magent-store-upstream-session7)
          nil t t)))

(provide 'magent-store-upstream)
;;; magent-store-upstream.el ends here
