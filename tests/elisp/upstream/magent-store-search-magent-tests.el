;;; magent-store-search-magent-tests.el --- RET on a search result resumes the session in magent  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions written through magent's own functions with `magent-store-mode'
;; on, found by the real `magent-store search' process, then opened with
;; RET: the session must come back through magent's own loader
;; (`magent-runtime-load-session-file', what magent's ACP session/load
;; runs), registered in magent's runtime under its scope, equal to what
;; magent's own save and read give for the same session.  Upstream
;; magent's code from MAGENT_LISP; its runtime needs yaml.el (Debian:
;; elpa-yaml): without it these tests are skipped loudly, and fail under
;; CI=true.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test-upstream)
(require 'magent-store-resume-tests)
(require 'magent-store-search)

(defvar magent-runtime-api--sessions)

(declare-function magent-runtime-session-p "ext:magent-runtime-api" (object))
(declare-function magent-runtime-session-id "ext:magent-runtime-api" (session))
(declare-function magent-runtime-session-scope "ext:magent-runtime-api" (session))
(declare-function magent-runtime-session-magent-session "ext:magent-runtime-api"
                  (session))
(declare-function magent-runtime-session-from-id "ext:magent-runtime-api"
                  (session-id &optional scope))

(defun magent-store-search-magent-test--runtime ()
  "Load magent's runtime, or skip loudly (fail under CI) without yaml.el."
  (unless (magent-store-test-upstream-available-p)
    (ert-skip "MAGENT_LISP does not name upstream magent's lisp/ folder"))
  (magent-store-test-upstream-need (magent-store-test-upstream-load-runtime)
                              "yaml.el, which magent's runtime needs"
                              "apt-get install elpa-yaml"))

(defun magent-store-search-magent-test--search (query)
  "Search the store for QUERY as M-x magent-store-search does; return the buffer."
  (let ((buffer (magent-store-search query)))
    (with-timeout (60 (error "The search did not finish"))
      (while (buffer-local-value 'magent-store-search--process buffer)
        (accept-process-output nil 0.05)))
    buffer))

(defun magent-store-search-magent-test--ret (buffer id)
  "Press RET in BUFFER on the line of session ID; return what it returned."
  (with-current-buffer buffer
    (goto-char (point-min))
    (while (and (not (eobp))
                (not (equal (alist-get 'id (tabulated-list-get-id)) id)))
      (forward-line 1))
    (should (equal (alist-get 'id (tabulated-list-get-id)) id))
    (call-interactively (key-binding (kbd "RET")))))

(ert-deftest magent-store-search-ret-resumes-the-session-in-magent ()
  "RET on a result loads its session through magent's own loader, in its
scope, equal to magent's own save and read of the same session."
  (magent-store-search-magent-test--runtime)
  (magent-store-resume-test--with-magent
    (let* ((magent-runtime-api--sessions (make-hash-table :test #'equal))
           (project (file-truename (file-name-directory magent-session-directory)))
           (global (magent-store-resume-test--new-session "20261130-200000-g"))
           (in-project (magent-store-resume-test--new-session
                        "20261130-200000-p" project))
           (own (list (cons "20261130-200000-g"
                            (magent-store-resume-test--own-save global 'global))
                      (cons "20261130-200000-p"
                            (magent-store-resume-test--own-save in-project project)))))
      (should (memq #'magent-store-magent--resume
                    magent-store-search-resume-functions))
      (magent-store-resume-test--restart)
      (let ((buffer (magent-store-search-magent-test--search "CHUNK 3 QUOTED")))
        (should (equal (sort (mapcar (lambda (entry) (alist-get 'id (car entry)))
                                     (buffer-local-value 'tabulated-list-entries buffer))
                             #'string<)
                       '("20261130-200000-g" "20261130-200000-p")))
        (pcase-dolist (`(,id . ,own-file) own)
          (let* ((expected (magent-store-resume-test--own-read own-file))
                 ;; The scope as magent reads it back from its own file.
                 (scope (plist-get expected :scope))
                 (runtime (progn
                            (should-not (magent-runtime-session-from-id id scope))
                            (magent-store-search-magent-test--ret buffer id))))
            (should (equal scope (if (equal id "20261130-200000-g") 'global
                                   (directory-file-name project))))
            (should (magent-runtime-session-p runtime))
            (should (equal (magent-runtime-session-id runtime) id))
            (should (equal (magent-runtime-session-scope runtime) scope))
            ;; Registered in magent's runtime, and installed as its scope's session.
            (should (eq (magent-runtime-session-from-id id scope) runtime))
            (should (eq (magent-session-get-if-present scope)
                        (magent-runtime-session-magent-session runtime)))
            (should (equal (magent-store-resume-test--state
                            (magent-runtime-session-magent-session runtime))
                           (magent-store-resume-test--state
                            (plist-get expected :session))))
            (should (= 2 (length (magent-thread-turns
                                  (magent-session-thread-ledger
                                   (magent-runtime-session-magent-session
                                    runtime))))))))))))

(ert-deftest magent-store-search-ret-without-the-mode-shows-the-transcript ()
  "With the mode off, magent's loader is not offered the store's files
\(its release cannot read them without the mode): RET shows the transcript."
  (magent-store-search-magent-test--runtime)
  (magent-store-resume-test--with-magent
    (let ((magent-runtime-api--sessions (make-hash-table :test #'equal)))
      (magent-store-resume-test--new-session "20261130-200100-g")
      (magent-store-resume-test--restart)
      (magent-store-mode -1)
      (should-not (memq #'magent-store-magent--resume
                        magent-store-search-resume-functions))
      (let* ((buffer (magent-store-search-magent-test--search "chunk 4"))
             (view (magent-store-search-magent-test--ret buffer "20261130-200100-g")))
        (should (bufferp view))
        (with-timeout (60 (error "The transcript did not appear"))
          (while (with-current-buffer view
                   (string-prefix-p "Reading" (buffer-string)))
            (accept-process-output nil 0.05)))
        (should (string-match-p "chunk 4 \"quoted\"" (with-current-buffer view
                                                     (buffer-string))))
        (should (= 0 (hash-table-count magent-runtime-api--sessions)))))))

(declare-function magent-runtime-session-register "ext:magent-runtime-api"
                  (scope session))

(ert-deftest magent-store-search-ret-on-a-streaming-session-leaves-it-alone ()
  "RET on a session that is streaming in this Emacs shows it where it
lives and never loads a second copy: the stored turn ends exactly as
the stream made it (magent's loader would reconcile a second copy as
after a restart, writing a cancelled item and an interrupted turn)."
  (magent-store-search-magent-test--runtime)
  (magent-store-resume-test--with-magent
    (let* ((magent-runtime-api--sessions (make-hash-table :test #'equal))
           (id "20261130-200200-s")
           (session (magent-store-resume-test--new-session id))
           (thread (magent-session-thread-ledger session))
           (turn-id nil) (item nil))
      (magent-runtime-session-register 'global session)
      (setq turn-id (magent-thread-turn-id
                     (magent-thread-queue-turn thread "A streamed question")))
      (magent-thread-start-turn thread turn-id)
      (setq item (magent-thread-start-item thread turn-id 'message
                                           :role 'assistant))
      (magent-thread-append-item-content thread item "streaming words ")
      (magent-store-flush id)
      (let* ((buffer (magent-store-search-magent-test--search "CHUNK 3 QUOTED"))
             (shown (magent-store-search-magent-test--ret buffer id)))
        ;; Shown, in a buffer that says where the session lives.
        (should (bufferp shown))
        (should (eq (window-buffer (selected-window)) shown))
        (should (string-match-p "open in magent"
                                (format "%s" (buffer-local-value
                                              'header-line-format shown))))
        (magent-store-search-magent-test--header-fits shown "open in magent")
        (kill-buffer shown))
      ;; One session object for the id, the live one.
      (should (eq (magent-session-get-if-present 'global) session))
      (magent-thread-append-item-content thread item "and the rest")
      (magent-thread-complete-item thread item
                                   :content (magent-thread-item-content item))
      (magent-thread-complete-turn thread turn-id '(:input-tokens 3))
      (magent-session-save-for-session session 'global)
      ;; The oracle: magent's own save and read of the live session.
      (let ((expected (magent-store-resume-test--state
                       (plist-get (magent-store-resume-test--own-read
                                   (magent-store-resume-test--own-save
                                    session 'global))
                                  :session))))
        (magent-store-resume-test--restart)
        (let* ((file (expand-file-name (concat "global/" id ".json")
                                       magent-session-directory))
               (stored (magent-session-read-file file))
               (turn (car (last (magent-thread-turns
                                 (magent-session-thread-ledger
                                  (plist-get stored :session)))))))
          (should (eq (magent-thread-turn-status turn) 'completed))
          (should-not (magent-thread-turn-error turn))
          (should (equal (magent-store-resume-test--state
                          (plist-get stored :session))
                         expected)))))))

(defun magent-store-search-magent-test--header-line (buffer window)
  "BUFFER's header line as WINDOW shows it."
  (let ((format (buffer-local-value 'header-line-format buffer)))
    (with-selected-window window
      (if (stringp format) format (eval (cadr format) t)))))

(defun magent-store-search-magent-test--header-fits (buffer where)
  "Check that BUFFER's header line fits a narrow and a wide window.
A wide one shows it whole, saying WHERE; a narrow one, its start."
  (let* ((size (cons (frame-width) (frame-height)))
         (wide (progn (set-frame-size (selected-frame) 200 (cdr size))
                      (selected-window)))
         (narrow (split-window-right (- (window-total-width) 32))))
    (unwind-protect
        (progn
          (set-window-buffer narrow buffer)
          (set-window-buffer wide buffer)
          (let ((shown (magent-store-search-magent-test--header-line buffer narrow)))
            (should (<= (string-width shown) (window-max-chars-per-line narrow)))
            (should (string-suffix-p "…" shown)))
          (delete-window narrow)
          (should (string-suffix-p
                   where (magent-store-search-magent-test--header-line buffer wide))))
      (when (window-live-p narrow) (delete-window narrow))
      (set-frame-size (selected-frame) (car size) (cdr size)))))

(ert-deftest magent-store-search-ret-displays-the-session-it-loaded ()
  "A session RET loads into magent is displayed, saying where it now is."
  (magent-store-search-magent-test--runtime)
  (magent-store-resume-test--with-magent
    (let ((magent-runtime-api--sessions (make-hash-table :test #'equal))
          (id "20261130-200300-g"))
      (magent-store-resume-test--new-session id)
      (magent-store-resume-test--restart)
      (let* ((buffer (magent-store-search-magent-test--search "chunk 2"))
             (runtime (magent-store-search-magent-test--ret buffer id))
             (shown (window-buffer (selected-window))))
        (should (magent-runtime-session-p runtime))
        (should-not (eq shown buffer))
        (should (string-match-p (regexp-quote id) (buffer-name shown)))
        (should (string-match-p "loaded in magent"
                                (format "%s" (buffer-local-value
                                              'header-line-format shown))))
        (magent-store-search-magent-test--header-fits
         shown "loaded in magent, as the current session of its scope")
        (kill-buffer shown)))))

(provide 'magent-store-search-magent-tests)
;;; magent-store-search-magent-tests.el ends here
