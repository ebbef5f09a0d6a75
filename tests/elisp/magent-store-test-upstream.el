;;; magent-store-test-upstream.el --- Load upstream magent for integration tests  -*- lexical-binding: t; -*-

;;; Commentary:

;; The integration tests run against magent's own code, never a copy of it:
;; MAGENT_LISP names upstream magent's lisp/ folder (docs/DEVELOPING.md
;; says how to get it).  Optionally MAGENT_SESSION7 names a folder holding a
;; newer magent-session.el that reads schema 7 itself; it is loaded over
;; the release's.  When gptel is not installed, tests/elisp/stubs stands in
;; for it (magent only requires it at load time; the tests never call it).

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'subr-x)

(defconst magent-store-test-upstream-lisp
  (let ((dir (getenv "MAGENT_LISP")))
    (and dir (not (string-empty-p dir)) (file-name-as-directory
                                           (expand-file-name dir))))
  "Upstream magent's lisp/ folder, from MAGENT_LISP, or nil.")

(defconst magent-store-test-upstream-session7
  (let ((dir (getenv "MAGENT_SESSION7")))
    (and dir (not (string-empty-p dir)) (file-name-as-directory
                                           (expand-file-name dir))))
  "Folder of a schema-7 magent-session.el, from MAGENT_SESSION7, or nil.")

(defconst magent-store-test-upstream--stubs
  (expand-file-name "stubs" (file-name-directory
                             (or load-file-name buffer-file-name)))
  "Stand-ins for packages magent requires that cannot be installed here.")

(defun magent-store-test-upstream-available-p ()
  "Return non-nil when upstream magent's code can be loaded."
  (and magent-store-test-upstream-lisp
       (file-readable-p (expand-file-name "magent-ledger.el"
                                          magent-store-test-upstream-lisp))))

(defun magent-store-test-upstream-load (&optional schema7)
  "Load upstream magent's ledger and session modules.
With SCHEMA7, load the schema-7 magent-session.el over the release's
\(signal an error when MAGENT_SESSION7 is not set)."
  (unless (magent-store-test-upstream-available-p)
    (error "MAGENT_LISP does not name upstream magent's lisp/ folder"))
  (add-to-list 'load-path magent-store-test-upstream-lisp)
  (unless (locate-library "gptel")
    (add-to-list 'load-path magent-store-test-upstream--stubs t))
  (require 'magent-ledger)
  (require 'magent-session)
  (when schema7
    (unless magent-store-test-upstream-session7
      (error "MAGENT_SESSION7 is not set"))
    (load (expand-file-name "magent-session.el" magent-store-test-upstream-session7)
          nil t t)))

(defun magent-store-test-upstream-need (present what how)
  "Go on when PRESENT is non-nil; else fail under CI=true, or skip loudly.
WHAT names the missing thing, HOW says how to get it."
  (unless present
    (let ((text (format "%s is missing (%s)" what how)))
      (if (member (downcase (or (getenv "CI") "")) '("1" "true" "yes"))
          (ert-fail (format "%s: under CI every test must run" text))
        (message "*** SKIPPED: %s; with CI=true this fails the run ***" text)
        (ert-skip text)))))

(defun magent-store-test-upstream-load-runtime ()
  "Load magent's runtime (`magent-runtime-api') over its sessions.
It needs yaml.el (Debian: elpa-yaml), looked for on `load-path' and
in Debian's Emacs package folders.  Return non-nil when it is loaded,
nil when yaml.el is missing."
  (magent-store-test-upstream-load)
  (unless (locate-library "yaml")
    (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/yaml-[0-9]*"))
      (add-to-list 'load-path dir)))
  (and (locate-library "yaml")
       (require 'magent-runtime-api)))

(provide 'magent-store-test-upstream)
;;; magent-store-test-upstream.el ends here
