;;; magent-store-adapter-tests.el --- The adapter's edges, through upstream magent  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store-mode' with upstream magent's own code (MAGENT_LISP) and a
;; real backend, at the edges of what the adapter does: an empty streamed
;; delta, a streamed NUL, an action session whose metadata does not say
;; where it came from, a session cleared after a restart in the scope
;; magent is in, the mode turned off before Emacs was ever idle, and the
;; mode turned on in a fresh Emacs (the timing follows it at once).
;;
;; RET on a search result, and the session of the current buffer, go
;; through magent's runtime (`magent-runtime-session-from-id'), its scope
;; table and its agent-shell module (`magent-agent-shell--buffers',
;; `magent-agent-shell--magent-buffer-p'), all in the pinned release.
;; Its runtime needs yaml.el (Debian: elpa-yaml): without it those tests
;; are skipped loudly, and fail under CI=true.
;;
;; Stand-ins, said here: magent's agent-shell module requires acp.el,
;; which it calls only to make a client; tests/elisp/stubs/acp.el stands
;; in for it when it is not installed.  The buffers are agent-shell's:
;; agent-shell itself needs Emacs 29 and cannot be installed here, so
;; when it is missing a buffer in `agent-shell-mode' holding
;; `agent-shell--state' in agent-shell's shape (the agent config's
;; identifier, the session's id) stands in for one.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'map)
(require 'subr-x)
(require 'magent-store-magent-tests)
(require 'magent-store-search-magent-tests)
(require 'magent-store-export)

(defvar magent--current-session)
(defvar magent-session--current-scope)
(defvar magent-session--scoped-sessions)
(defvar magent-session--metadata-cache)
(defvar magent-session--loaded-sessions)
(defvar magent-runtime-api--sessions)
(defvar magent-agent-shell--identifier)
(defvar magent-lifecycle-events--sinks)
(defvar agent-shell--state)

(declare-function magent-runtime-session-from-id "ext:magent-runtime-api"
                  (session-id &optional scope))
(declare-function magent-runtime-session-register "ext:magent-runtime-api"
                  (scope session))
(declare-function magent-runtime-session-magent-session "ext:magent-runtime-api"
                  (session))
(declare-function magent-session-install "ext:magent-session" (scope session))
(declare-function agent-shell-mode "ext:agent-shell" ())

;;;; Helpers

(defun magent-store-adapter-test--header-tick ()
  "Wait, as Emacs does, for the pending header refresh (if any) to run."
  (with-timeout (30 (error "The header refresh did not come"))
    (while magent-store-magent--header-timer
      (accept-process-output nil 0.05))))

(defun magent-store-adapter-test--header-on-disk (session scope)
  "SESSION's header file under SCOPE as the backend last wrote it, parsed.
Nothing is saved first: what the file holds is what earlier saves left."
  (magent-store-flush (magent-session-get-id session))
  (with-temp-buffer
    (let ((coding-system-for-read 'utf-8-unix))
      (insert-file-contents
       (magent-store-magent-test--header-file session scope)))
    (magent-store-magent-test--parse (buffer-string))))

(defun magent-store-adapter-test--store-files (session scope)
  "The store's files of SESSION under SCOPE that exist: its log, its snapshot."
  (let ((base (file-name-sans-extension
               (magent-store-magent-test--header-file session scope))))
    (cl-remove-if-not #'file-exists-p
                      (list (concat base ".jsonl") (concat base ".snapshot")))))

(defun magent-store-adapter-test--agent-shell ()
  "Load magent's runtime and agent-shell module, or skip loudly.
acp.el, when missing, and agent-shell's mode, when agent-shell is not
installed, are stood in for (see the Commentary)."
  (magent-store-search-magent-test--runtime)
  (unless (locate-library "acp")
    (add-to-list 'load-path (expand-file-name "../stubs" magent-store-resume-test--here) t))
  (require 'magent-agent-shell)
  (unless (or (fboundp 'agent-shell-mode) (require 'agent-shell nil t))
    (eval '(progn
             (define-derived-mode agent-shell-mode comint-mode "Agent-Shell"
               "Stand-in for agent-shell's mode.")
             (defvar-local agent-shell--state nil))
          t)))

(defun magent-store-adapter-test--shell (identifier id)
  "Return a new agent-shell buffer of the agent IDENTIFIER holding session ID."
  (let ((buffer (generate-new-buffer (format "*%s %s*" identifier id))))
    (with-current-buffer buffer
      (agent-shell-mode)
      (setq agent-shell--state
            (list (cons :agent-config (list (cons :identifier identifier)
                                            (cons :buffer-name "Agent")))
                  (cons :session (list (cons :id id)))
                  (cons :initialized t))))
    buffer))

;;;; Streaming edges

(ert-deftest magent-store-adapter-an-empty-delta-leaves-the-next-save-whole ()
  "An empty streamed delta appends nothing: the save magent asks for after
it refreshes the header like any other save (a header field changed)."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((action (magent-store-magent-test--action "s-empty-delta" "review"
                                                     'global))
           (session (car action))
           (scope (cdr action))
           (thread (magent-session-thread-ledger session))
           (turn-id (magent-thread-turn-id
                     (magent-thread-create-turn thread "Review this")))
           (item (magent-thread-start-item thread turn-id 'message
                                           :role 'assistant)))
      (magent-thread-append-item-content thread item "Looks good.")
      (magent-session-save-deferred-for-session session scope)
      (magent-session-save-for-session session scope)
      (magent-store-adapter-test--header-tick)
      (should (equal (alist-get 'status (magent-store-adapter-test--header-on-disk
                                         session scope))
                     "running"))
      ;; The action ends; the provider's last delta is empty.
      (magent-session-set-metadata-value session 'status "completed")
      (magent-thread-append-item-content thread item "")
      (magent-session-save-deferred-for-session session scope)
      (magent-store-adapter-test--header-tick)
      (let ((header (magent-store-adapter-test--header-on-disk session scope)))
        (should (equal (alist-get 'status header) "completed"))
        (magent-store-magent-test--should-equal
         header (magent-store-magent-test--magent-header session scope)))
      (should (equal (magent-thread-item-content item) "Looks good."))
      (should-not magent-store-magent--adapter-failures))))

(ert-deftest magent-store-adapter-a-streamed-nul-reads-back ()
  "A streamed chunk holding NUL is read back by this Emacs and by magent's
reader: kept where this Emacs's JSON reader reads NUL, else U+FFFD in
its place (Emacs 28), noted for the status."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((magent-session--metadata-cache (make-hash-table :test #'equal))
           (magent-session--loaded-sessions (make-hash-table :test #'eq))
           (session (magent-store-magent-test--session "s-nul-chunk" 'global))
           (thread (magent-session-thread-ledger session))
           (turn-id (magent-thread-turn-id
                     (magent-thread-create-turn thread "Print the bytes")))
           (item (magent-thread-start-item thread turn-id 'message
                                           :role 'assistant))
           (expected (if magent-store-magent--reader-refuses-nul
                         "before \ufffd after"
                       "before \0 after")))
      ;; Saved mid-stream: the text is only in the streamed chunks.
      (magent-thread-append-item-content thread item "before \0 after")
      (magent-session-save-deferred-for-session session 'global)
      (magent-session-save-for-session session 'global)
      (let* ((store (magent-store-magent-test--store-snapshot session 'global))
             (stored (aref (alist-get 'items (aref (alist-get 'turns store) 0)) 0)))
        (should (equal (alist-get 'content stored) expected)))
      (should (eq (and (assoc "a NUL character" magent-store-magent--unencodable) t)
                  magent-store-magent--reader-refuses-nul))
      ;; magent's own reader, after a restart.
      (magent-store-stop)
      (let* ((loaded (magent-session-read-file
                      (magent-store-magent-test--header-file session 'global)))
             (turn (car (magent-thread-turns
                         (magent-session-thread-ledger (plist-get loaded :session))))))
        (should (equal (magent-thread-item-content
                        (car (magent-thread-turn-items turn)))
                       expected)))
      (should-not magent-store-magent--adapter-failures))))

;;;; Headers

(ert-deftest magent-store-adapter-an-action-session-without-its-origin-in-metadata ()
  "An action session whose metadata does not say where it came from
belongs to its scope's origin, a project here: its header says so, as
magent's own does."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((root (magent-store-magent-test--project "origin"))
           (scope (magent-session-action-scope "s-no-origin" "lint" root))
           (session (magent-store-magent-test--session
                     "s-no-origin" scope
                     '((kind . "action") (action . "lint") (status . "running")))))
      (should-not (assq 'origin-scope (magent-session-metadata session)))
      (magent-store-magent-test--turn session scope "Lint" 'completed)
      (let ((header (magent-store-magent-test--store-header session scope)))
        (should (equal (alist-get 'scope header) "project"))
        (should (equal (alist-get 'project-root header) root))
        (magent-store-magent-test--should-equal
         header (magent-store-magent-test--magent-header session scope)))
      (should-not magent-store-magent--adapter-failures))))

;;;; Clearing

(ert-deftest magent-store-adapter-a-clear-after-a-restart-finds-the-files ()
  "After a restart, magent clears a session in the scope magent is in when
it gives none, else in the one it gives: the store's files go either way."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((root (magent-store-magent-test--project "clear-after-restart"))
           (here (magent-store-magent-test--session "s-clear-here" root))
           (there (magent-store-magent-test--session "s-clear-there" root)))
      (dolist (session (list here there))
        (magent-store-magent-test--turn session root "Before" 'completed)
        (magent-session-save-for-session session root)
        (should (= 2 (length (magent-store-adapter-test--store-files session root)))))
      (magent-store-stop)
      ;; No scope given: the current one, the project.
      (let ((magent-session--current-scope root))
        (magent-session-clear here))
      ;; A scope given: that one, whatever the current one.
      (let ((magent-session--current-scope 'global))
        (magent-session-clear there root))
      (should-not (magent-store-adapter-test--store-files here root))
      (should-not (magent-store-adapter-test--store-files there root))
      (should-not (file-exists-p (magent-store-magent-test--header-file here root)))
      (should-not (file-exists-p (magent-store-magent-test--header-file there root)))
      (should-not magent-store-magent--adapter-failures))))

;;;; The mode on and off

(ert-deftest magent-store-adapter-turned-off-the-mode-leaves-no-idle-timer ()
  "Turned off before Emacs was ever idle, the mode leaves none of its idle
timers pending (each costs Emacs at every wakeup); on again, it sets one
backend start."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let ((mine (lambda ()
                  (cl-remove-if-not
                   (lambda (timer)
                     (memq (timer--function timer)
                           '(magent-store-magent--start-backend
                             magent-store-magent--prepare-finder)))
                   timer-idle-list))))
      (should-not magent-store-current-backend)
      (should (= 2 (length (funcall mine))))
      (magent-store-mode -1)
      (should-not (funcall mine))
      (magent-store-mode 1)
      (should (= 1 (cl-count #'magent-store-magent--start-backend timer-idle-list
                             :key #'timer--function))))))

(ert-deftest magent-store-adapter-the-timing-follows-the-mode-from-its-first-start ()
  "In a fresh Emacs with magent loaded, the first time the mode turns on
magent's lifecycle events reach the timing records; off, they no longer do."
  (magent-store-magent-test--use-magent 6)
  (let* ((tmp (make-temp-file "magent-store-timing-first-" t))
         (process-environment
          (cons (concat "XDG_STATE_HOME=" (expand-file-name "state" tmp))
                process-environment))
         (here magent-store-resume-test--here)
         (form
          `(progn
             (require 'magent-store-test-upstream)
             (magent-store-test-upstream-load)
             (require 'magent-lifecycle-events)
             (require 'magent-store-magent)
             (setq magent-session-directory ,(expand-file-name "sessions" tmp))
             (let ((before (featurep 'magent-store-timing))
                   (types (lambda ()
                            (and (boundp 'magent-store-timing--queue)
                                 (mapcar #'car (symbol-value
                                                'magent-store-timing--queue))))))
               (magent-store-mode 1)
               (magent-lifecycle-events-end-turn
                (magent-lifecycle-events-begin-turn "on") 'completed)
               (let ((on (funcall types)))
                 (magent-store-mode -1)
                 (magent-lifecycle-events-begin-turn "off")
                 (list before on (funcall types)))))))
    (unwind-protect
        (with-temp-buffer
          (let ((status (call-process
                         (expand-file-name invocation-name invocation-directory)
                         nil t nil "--batch" "-Q"
                         "--eval" "(setq load-prefer-newer t)"
                         "-L" (expand-file-name "../../../elisp" here)
                         "-L" (expand-file-name ".." here)
                         "-L" here
                         "--eval" (format "(prin1 %S)" form))))
            (should (equal (list status (progn (goto-char (point-max))
                                               (backward-sexp)
                                               (read (current-buffer))))
                           '(0 (nil (turn-end turn-start) (turn-end turn-start)))))))
      (delete-directory tmp t))))

;;;; Sessions magent holds, and its buffers

(ert-deftest magent-store-adapter-ret-on-a-session-magent-holds-outside-its-runtime ()
  "RET on a session magent holds in its scope table but not in its runtime
shows it where it lives and loads no second copy of it."
  (magent-store-search-magent-test--runtime)
  (magent-store-resume-test--with-magent
    (let* ((magent-runtime-api--sessions (make-hash-table :test #'equal))
           (magent-session--current-scope 'global)
           (magent--current-session nil)
           (id "20261203-070000-h")
           (session (magent-store-resume-test--new-session id)))
      (magent-session-install 'global session)
      (should-not (magent-runtime-session-from-id id))
      (let* ((buffer (magent-store-search-magent-test--search "CHUNK 3 QUOTED"))
             (shown (magent-store-search-magent-test--ret buffer id)))
        (should (bufferp shown))
        (should (string-match-p "open in magent"
                                (format "%s" (buffer-local-value
                                              'header-line-format shown))))
        (kill-buffer shown))
      (should-not (magent-runtime-session-from-id id))
      (should (eq (magent-session-get-if-present 'global) session)))))

(ert-deftest magent-store-adapter-ret-shows-magents-own-buffer-of-the-session ()
  "RET on a session magent shows in one of its agent-shell buffers pops to
that buffer, not another agent's nor another session's."
  (magent-store-adapter-test--agent-shell)
  (magent-store-resume-test--with-magent
    (let* ((magent-runtime-api--sessions (make-hash-table :test #'equal))
           (magent-session--current-scope 'global)
           (magent--current-session nil)
           (id "20261203-070100-b")
           (session (magent-store-resume-test--new-session id))
           (buffers (list (magent-store-adapter-test--shell 'claude-code id)
                          (magent-store-adapter-test--shell
                           magent-agent-shell--identifier "20261203-070100-x")
                          (magent-store-adapter-test--shell
                           magent-agent-shell--identifier id))))
      (unwind-protect
          (progn
            (magent-runtime-session-register 'global session)
            (let* ((buffer (magent-store-search-magent-test--search "CHUNK 3 QUOTED"))
                   (shown (magent-store-search-magent-test--ret buffer id)))
              (should (eq shown (nth 2 buffers)))
              (should (eq (window-buffer (selected-window)) (nth 2 buffers))))
            (should (eq (magent-runtime-session-magent-session
                         (magent-runtime-session-from-id id))
                        session)))
        (mapc #'kill-buffer buffers)))))

(ert-deftest magent-store-adapter-the-session-of-magents-buffer ()
  "The session of magent's buffer is its session's id, in it and from
elsewhere; exporting there exports it.  Another agent's buffer, or any
other, has none."
  (magent-store-adapter-test--agent-shell)
  (magent-store-resume-test--with-magent
    (let* ((id "20261203-070200-e")
           (mine (magent-store-adapter-test--shell magent-agent-shell--identifier id))
           (theirs (magent-store-adapter-test--shell 'claude-code id))
           (plain (generate-new-buffer "*plain*")))
      (unwind-protect
          (progn
            (magent-store-resume-test--new-session id)
            (with-current-buffer mine
              (should (equal (magent-store-magent-session-id) id))
              (should (equal (alist-get 'id (magent-store-export--session-here)) id)))
            (should (equal (magent-store-magent-session-id mine) id))
            (dolist (buffer (list theirs plain))
              (ert-info ((buffer-name buffer))
                (should-not (magent-store-magent-session-id buffer))
                (with-current-buffer buffer
                  (should-not (magent-store-magent-session-id))
                  (should-not (magent-store-export--session-here))))))
        (mapc #'kill-buffer (list mine theirs plain))))))

(provide 'magent-store-adapter-tests)
;;; magent-store-adapter-tests.el ends here
