;;; tool-race-driver.el --- upstream magent saving sessions while the history tools run  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Run by tests/faults/tool_race.py as
;;   emacs --batch -Q -L tests/elisp -l tests/faults/tool-race-driver.el DIR
;; with MAGENT_LISP naming upstream magent's lisp/ folder.  Upstream
;; magent's own code (its release, schema 6, no lock) makes, loads, saves
;; and reads sessions on request: a request is a file DIR/req-N holding one
;; plist, its answer DIR/resp-N (written whole, then renamed).  Requests:
;;
;;   (:op create :root R :id ID :scope global-or-root :prompt P)
;;       a new session with one turn of prompt P, saved; answers its file
;;   (:op load :root R :file F)   read F and keep the session in memory
;;   (:op save :root R :file F :turn T :memory M)
;;       a new turn of prompt T, saved as magent saves it: on the session
;;       read from F now, or (M) on the one kept in memory
;;   (:op check :file F)          the prompts of F's turns, one a line,
;;                                as magent's reader reads them
;;   (:op quit)

;;; Code:

(require 'cl-lib)
(require 'magent-store-test-upstream)

(defvar magent-session-directory)
(defvar magent-session--current-scope)

(magent-store-test-upstream-load)

(defvar tool-race--dir (file-name-as-directory (car command-line-args-left))
  "Where requests come and answers go.")

(defvar tool-race--held (make-hash-table :test #'equal)
  "Sessions kept in memory: file -> (SESSION . SCOPE).")

(defun tool-race--answer (n text)
  "Answer request N with TEXT, whole."
  (let ((tmp (expand-file-name (format ".resp-%d" n) tool-race--dir)))
    (with-temp-file tmp
      (set-buffer-file-coding-system 'utf-8-unix)
      (insert text))
    (rename-file tmp (expand-file-name (format "resp-%d" n) tool-race--dir) t)))

(defun tool-race--add-turn (session prompt)
  "Play one completed turn of PROMPT in SESSION."
  (let* ((thread (magent-session-thread-ledger session))
         (turn (magent-thread-create-turn thread prompt nil
                                          (list :source 'agent-run-turn)))
         (turn-id (magent-thread-turn-id turn)))
    (magent-thread-record-user-message-if-needed
     thread turn-id prompt nil (list :source 'agent-run-turn))
    (let ((item (magent-thread-start-item thread turn-id 'message :role 'assistant)))
      (magent-thread-complete-item thread item :content (concat "answer to " prompt)))
    (magent-thread-complete-turn thread turn-id)))

(defun tool-race--read (file)
  "FILE read by magent: (SESSION . SCOPE), or an error."
  (let ((read (magent-session-read-file file)))
    (unless (plist-get read :session)
      (error "magent cannot read %s" file))
    (cons (plist-get read :session) (plist-get read :scope))))

(defun tool-race--do (request)
  "Carry out REQUEST; return the answer's text."
  (let ((magent-session-directory (or (plist-get request :root) magent-session-directory)))
    (pcase (plist-get request :op)
      ('create
       (let* ((scope (plist-get request :scope))
              (session (magent-session-create :id (plist-get request :id))))
         (let ((magent-session--current-scope scope))
           (magent-session-thread-ledger session))
         (tool-race--add-turn session (plist-get request :prompt))
         (magent-session-save-for-session session scope)
         (expand-file-name (concat (plist-get request :id) ".json")
                           (magent-session--scope-storage-directory scope))))
      ('load
       (puthash (plist-get request :file) (tool-race--read (plist-get request :file))
                tool-race--held)
       "loaded")
      ('save
       (let ((pair (if (plist-get request :memory)
                       (gethash (plist-get request :file) tool-race--held)
                     (tool-race--read (plist-get request :file)))))
         (tool-race--add-turn (car pair) (plist-get request :turn))
         (magent-session-save-for-session (car pair) (cdr pair))
         "saved"))
      ('check
       (let ((session (car (tool-race--read (plist-get request :file)))))
         (mapconcat #'magent-thread-turn-input
                    (magent-thread-turns (magent-session-thread-ledger session))
                    "\n"))))))

(defun tool-race--loop ()
  "Answer requests until one says quit."
  (let ((n 0) (quit nil))
    (while (not quit)
      (let ((file (expand-file-name (format "req-%d" (1+ n)) tool-race--dir)))
        (if (not (file-exists-p file))
            (sleep-for 0.005)
          (setq n (1+ n))
          (let ((request (with-temp-buffer
                           (insert-file-contents file)
                           (read (current-buffer)))))
            (if (eq (plist-get request :op) 'quit)
                (setq quit t)
              (tool-race--answer
               n (condition-case err
                     (tool-race--do request)
                   (error (format "error: %s" (error-message-string err))))))))))))

(tool-race--loop)

;;; tool-race-driver.el ends here
