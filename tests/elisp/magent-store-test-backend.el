;;; magent-store-test-backend.el --- A real backend for each ERT test  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The one fixture every ERT suite, and every Emacs a test starts, uses
;; for a backend: epc.el on the load path (`emacs -Q' does not activate
;; Debian's elpa-epc), and `magent-store-test-with-backend', which runs
;; its body with a fresh session root and state directory, the core's
;; state bound afresh, and a real backend started by the shim exactly as
;; a user's Emacs starts it, stopped and removed after.  `make
;; test-elisp' sets `magent-store-test-python' to the checkout's
;; .venv/bin/magent-store.

;;; Code:

;; `emacs -Q' does not activate Debian's elpa-epc: put it on the path.
(unless (locate-library "epc")
  (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path dir)))

(defvar magent-store-test-python nil
  "The backend command under test; nil means the shim's default.")

(defvar magent-store-test-stop-argument nil
  "The argument `magent-store-test-with-backend' stops the backend with.
Bind it to \\='(4) among the fixture's bindings to drop what is unsaved.")

(defmacro magent-store-test-with-backend (bindings &rest body)
  "Run BODY with a private root and state dir; stop the backend after.
TMP names the private directory.  BINDINGS are more `let*' bindings,
made after the fixture's own (so they may use TMP, or bind one of the
fixture's variables again)."
  (declare (indent 1) (debug t))
  `(let* ((tmp (make-temp-file "magent-store-test-" t))
          (magent-store-root (expand-file-name "root" tmp))
          (magent-store-python (or magent-store-test-python magent-store-python))
          (process-environment
           (cons (concat "XDG_STATE_HOME=" (expand-file-name "state" tmp))
                 process-environment))
          (magent-store--sessions (make-hash-table :test #'equal))
          (magent-store--recent nil)
          (magent-store-current-backend nil)
          (magent-store--restarts nil)
          (magent-store-gave-up nil)
          (magent-store-last-error nil)
          (magent-store-flush-ms nil)
          (magent-store-persistence-enabled t)
          (magent-store-test-stop-argument nil)
          ,@bindings)
     (unwind-protect
         (progn ,@body)
       (ignore-errors (magent-store-stop magent-store-test-stop-argument))
       (when magent-store-current-backend
         (magent-store--kill-backend magent-store-current-backend))
       (delete-directory tmp t))))

(provide 'magent-store-test-backend)
;;; magent-store-test-backend.el ends here
