;;; magent-store-magent.el --- The adapter between magent and magent-store  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Everything that knows magent's internals lives here: which of magent's
;; functions `magent-store-mode' advises and how, how a header is built
;; from magent's session object, and how magent's read side is answered
;; from the store.  The shim core (magent-store.el) knows only sessions,
;; events, chunks and flushes.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'magent-store)

;;;; Write side: events, chunks and saves


(declare-function magent-thread-session-id "ext:magent-ledger" (thread))
(declare-function magent-thread-scope "ext:magent-ledger" (thread))
(declare-function magent-thread-item-id "ext:magent-ledger" (item))
(declare-function magent-thread-event-to-alist "ext:magent-ledger" (event))
(declare-function magent-session-get-id "ext:magent-session" (session))
(declare-function magent-session-thread-ledger "ext:magent-session" (session))

(defvar magent-store-header-function #'magent-store--default-header
  "Function of (SESSION SCOPE) returning a magent session's header alist.")

(defun magent-store--default-header (session scope)
  "Return SESSION's header for SCOPE, through magent's own builder if any."
  (if (fboundp 'magent-session--header-data-for-session)
      (funcall 'magent-session--header-data-for-session session scope)
    `((id . ,(magent-session-get-id session))
      (schema-version . 7)
      (scope . ,(if (stringp scope) "project" "global"))
      (project-root . ,(and (stringp scope) scope))
      (agent-jobs . [])
      (approval-overrides . []))))

(defun magent-store--thread-session (thread)
  "Return the open store session for magent THREAD, opening it if needed."
  (let ((id (magent-thread-session-id thread))
        (recent magent-store--recent))
    (if (and recent (eq id (car recent)))
        (cdr recent)
      (let ((session (magent-store--ensure-session
                      id (magent-store--scope-arg (magent-thread-scope thread)))))
        (setq magent-store--recent (cons id session))
        session))))

(defun magent-store--after-append-event (thread event)
  "Forward EVENT, just appended to THREAD, to the backend."
  (when (and thread event magent-store-persistence-enabled)
    (let ((text (condition-case err
                    (magent-store--json (magent-thread-event-to-alist event))
                  ;; Never into magent's own call: say what was dropped.
                  (error
                   (setq magent-store--last-error
                         (format "event not saved: %s" (error-message-string err)))
                   (message "magent-store: %s" magent-store--last-error)
                   nil))))
      (when text
        (magent-store--push (magent-store--thread-session thread)
                            text (length text))))))

(defun magent-store--after-append-item-content (thread item chunk
                                                       &optional output-p)
  "Forward CHUNK, just appended to ITEM of THREAD (output if OUTPUT-P)."
  (when (and thread item (stringp chunk) (> (length chunk) 0)
             magent-store-persistence-enabled)
    (magent-store--push (magent-store--thread-session thread)
                        (list (magent-thread-item-id item) chunk
                              (and output-p t)
                              (truncate (float-time) 0.001))
                        (length chunk))))

(defun magent-store--session-id-of (session)
  "Return the store session id of magent SESSION."
  (magent-thread-session-id (magent-session-thread-ledger session)))

(defun magent-store--around-save-deferred (_orig session &optional _scope _delay)
  "Replace magent's deferred save of SESSION by a flush request."
  (let ((thread (magent-session-thread-ledger session)))
    (magent-store--thread-session thread)
    (magent-store-request-flush (magent-thread-session-id thread))))

(defun magent-store--around-save (_orig session scope)
  "Replace magent's synchronous save of SESSION under SCOPE."
  (let* ((thread (magent-session-thread-ledger session))
         (id (magent-thread-session-id thread)))
    (magent-store--ensure-session id (magent-store--scope-arg scope))
    (magent-store-put-header id (funcall magent-store-header-function
                                         session scope))
    (magent-store-flush id)))

(defun magent-store--before-load (filepath &rest _)
  "Flush the session of FILEPATH, for magent to load all of it.
The backend writes magent's own schema-7 files, so magent reads them
itself; what it must not miss is what Emacs has not sent yet."
  (let ((id (file-name-base filepath)))
    (when (and magent-store--backend (gethash id magent-store--sessions))
      (magent-store-flush id))))

(defconst magent-store--advice
  '((magent-thread-append-event :after magent-store--after-append-event)
    (magent-thread-append-item-content
     :after magent-store--after-append-item-content)
    (magent-session-save-deferred-for-session
     :around magent-store--around-save-deferred)
    (magent-session-save-for-session :around magent-store--around-save)
    (magent-session-load :before magent-store--before-load))
  "The advice `magent-store-mode' installs: (FUNCTION HOW ADVICE).")

(defun magent-store--kill-emacs ()
  "Flush everything before Emacs exits."
  (when magent-store--backend
    (condition-case err
        (magent-store-stop)
      (error (message "magent-store: flush at exit failed: %s"
                      (error-message-string err))))))

;;;###autoload
(define-minor-mode magent-store-mode
  "Route magent's session persistence through the magent-store backend.
Events and streamed chunks are forwarded as magent appends them, saves
become flush requests, a session is flushed before magent loads it, and
Emacs flushes everything before it exits."
  :global t
  :group 'magent-store
  (pcase-dolist (`(,function ,how ,advice) magent-store--advice)
    (if magent-store-mode
        (advice-add function how advice)
      (advice-remove function advice)))
  (if magent-store-mode
      (add-hook 'kill-emacs-hook #'magent-store--kill-emacs)
    (remove-hook 'kill-emacs-hook #'magent-store--kill-emacs)))

(provide 'magent-store-magent)
;;; magent-store-magent.el ends here
