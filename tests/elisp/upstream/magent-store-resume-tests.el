;;; magent-store-resume-tests.el --- Sessions come back through magent's own functions  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; With `magent-store-mode' on, magent's own listing and reader
;; (upstream's real code, loaded from MAGENT_LISP) must find every session
;; the backend wrote, equal to what magent held.  A real backend, over a
;; real EPC socket; "a restart" stops the backend and forgets everything
;; magent held, or (for the crash) runs in a child Emacs that is killed.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-upstream)
(unless (locate-library "epc")
  (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path dir)))
(require 'magent-store)
(when (magent-store-upstream-available-p)
  (magent-store-upstream-load)
  (require 'magent-agent-job))

(defvar magent-store-test-python nil
  "The backend command under test; nil means the shim's default.")

(defvar magent-session-directory)
(defvar magent-session--metadata-cache)
(defvar magent-session--loaded-sessions)
(defvar magent-session--scoped-sessions)
(defvar magent-session-schema-version)

(defconst magent-store-resume-test--here
  (file-name-directory (or load-file-name buffer-file-name))
  "This file's folder.")

(defmacro magent-store-resume-test--with-magent (&rest body)
  "Run BODY with the mode on, a private session root and a real backend."
  (declare (indent 0) (debug t))
  `(let* ((tmp (make-temp-file "magent-store-resume-" t))
          (magent-session-directory (expand-file-name "sessions" tmp))
          (magent-store-root nil)
          (magent-store-flush-interval 0.05)
          (magent-store-python (or magent-store-test-python magent-store-python))
          (process-environment
           (cons (concat "XDG_STATE_HOME=" (expand-file-name "state" tmp))
                 process-environment))
          (magent-store--sessions (make-hash-table :test #'equal))
          (magent-store--recent nil)
          (magent-store--backend nil)
          (magent-store--restarts nil)
          (magent-store--gave-up nil)
          (magent-store--export-offered nil)
          (magent-session--metadata-cache (make-hash-table :test #'equal))
          (magent-session--loaded-sessions (make-hash-table :test #'eq))
          (magent-session--scoped-sessions (make-hash-table :test #'equal)))
     (magent-store-mode 1)
     (unwind-protect
         (progn ,@body)
       (magent-store-mode -1)
       (ignore-errors (magent-store-stop))
       (when magent-store--backend
         (magent-store--kill-backend magent-store--backend))
       (delete-directory tmp t))))

(defun magent-store-resume-test--restart ()
  "Stop the backend and forget what Emacs and magent held, as a restart does."
  (magent-store-stop)
  (clrhash magent-session--metadata-cache)
  (clrhash magent-session--loaded-sessions)
  (clrhash magent-session--scoped-sessions))

(defun magent-store-resume-test--converse (session turns &optional chunks)
  "Run TURNS turns in SESSION as magent does, streaming CHUNKS chunks each.
Return the id of the last turn."
  (let ((thread (magent-session-thread-ledger session)) turn-id)
    (dotimes (n turns)
      (let* ((turn (magent-thread-queue-turn
                    thread (format "Question %d: what is ünïcode? 🧪" n)))
             (item nil))
        (setq turn-id (magent-thread-turn-id turn))
        (magent-thread-start-turn thread turn-id)
        (setq item (magent-thread-start-item thread turn-id 'message
                                             :role 'assistant))
        (dotimes (c (or chunks 5))
          (magent-thread-append-item-content
           thread item (format "chunk %d \"quoted\"\n" c)))
        (magent-thread-complete-item thread item
                                     :content (magent-thread-item-content item))
        (magent-thread-complete-turn thread turn-id '(:input-tokens 12))))
    turn-id))

(defun magent-store-resume-test--new-session (id &optional scope)
  "Return a new magent session ID, saved under SCOPE through magent."
  (let ((session (magent-session-create
                  :id id :metadata '((title . "Résumé test")))))
    (magent-session-thread-ledger session)
    (magent-store-resume-test--converse session 2)
    (magent-session-set-approval-override session 'shell 'allow)
    (magent-session-add-agent-job
     session (magent-agent-job-create :id (concat id "-job") :parent-session-id id
                                      :agent-name "explore" :status 'completed
                                      :prompt "look around"))
    (magent-session-save-for-session session (or scope 'global))
    session))

(defun magent-store-resume-test--state (session)
  "Return SESSION as comparable data: thread, agent jobs, overrides, metadata."
  (let ((snapshot (magent-thread-snapshot-to-alist
                   (magent-session-thread-ledger session))))
    (list :thread (cl-remove-if (lambda (cell)
                                  (memq (car cell) '(snapshot-created-at
                                                     last-event-seq)))
                                snapshot)
          :agent-jobs (mapcar #'magent-agent-job-to-alist
                              (magent-session-agent-jobs session))
          :approval-overrides (magent-session-approval-overrides session)
          :metadata (magent-session-metadata session))))

;; magent's own persistence is the oracle: the same session saved by
;; magent itself (its functions without our advice) into a second root and
;; read back by magent must equal what the store gives back.

(defun magent-store-resume-test--own-save (session scope)
  "Save SESSION under SCOPE as magent itself does, in an own root; return the file."
  (let ((magent-session-directory (concat magent-session-directory "-own")))
    (funcall (advice--cd*r (symbol-function 'magent-session-save-for-session))
             session scope)))

(defun magent-store-resume-test--own-read (file)
  "Read FILE, saved by `magent-store-resume-test--own-save', as magent does."
  (let ((magent-session-directory (concat magent-session-directory "-own")))
    (magent-session-read-file file)))

(defun magent-store-resume-test--own-metadata (file)
  "Return magent's listing metadata of its own FILE."
  (let ((magent-session-directory (concat magent-session-directory "-own")))
    (magent-session--read-file-metadata file)))

(ert-deftest magent-store-resume-lists-and-reads-what-the-backend-wrote ()
  "magent's own listing and reader return the session magent held."
  (skip-unless (magent-store-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((id "20261130-120000-a")
           (session (magent-store-resume-test--new-session id))
           (own (magent-store-resume-test--own-save session 'global))
           (file (expand-file-name (concat "global/" id ".json")
                                   magent-session-directory)))
      (magent-store-resume-test--restart)
      (should (eql (magent-store--file-schema file) 7))
      (should (eql (magent-store--file-schema own) 6))
      ;; The listing, and what the picker shows of it.
      (should (equal (magent-session-list-files) (list file)))
      (should (equal (magent-session-list-files-for-scope 'global) (list file)))
      (let ((meta (magent-session--read-file-metadata-cached file)))
        (should (plist-get meta :valid))
        (should (equal (plist-get meta :summary-title) "Résumé test"))
        (should (equal meta (magent-store-resume-test--own-metadata own))))
      ;; The session, equal to magent's own round trip of it.
      (let* ((loaded (magent-session-read-file file))
             (expected (magent-store-resume-test--own-read own))
             (after (plist-get loaded :session)))
        (should after)
        (should (eq (plist-get loaded :scope) 'global))
        (should (equal (plist-get loaded :id) id))
        (should (equal (magent-store-resume-test--state after)
                       (magent-store-resume-test--state
                        (plist-get expected :session))))
        (should (= 2 (length (magent-thread-turns
                              (magent-session-thread-ledger after)))))
        (should (equal (gethash after magent-session--loaded-sessions) file))))))

(provide 'magent-store-resume-tests)
;;; magent-store-resume-tests.el ends here
