;;; machine-driver.el --- One machine of a Syncthing pair: upstream magent with the mode on  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Run by tests/sync/syncthing.py as
;;   emacs --batch -Q -L elisp -L tests/elisp -l tests/sync/machine-driver.el DIR ROOT PYTHON
;; with MAGENT_LISP naming upstream magent's lisp/ folder, and HOME and
;; XDG_STATE_HOME this machine's own.  Upstream magent's own code, with
;; `magent-store-mode' on and a real backend (PYTHON), keeps its sessions
;; in ROOT, the folder Syncthing shares.  This Emacs lives as long as the
;; test: a session it holds in memory stays held between requests, as in
;; an Emacs left open.  A request is a file DIR/req-N holding one plist;
;; its answer is DIR/resp-N (written whole, then renamed).  Requests:
;;
;;   (:op new :id ID :title TITLE :prompt P)
;;       a new global session ID titled TITLE with one turn asking P, saved
;;   (:op turn :id ID :prompt P)
;;       read session ID from disk as magent does, add a turn asking P, save
;;   (:op hold :id ID)        read session ID and keep it in memory
;;   (:op held-turn :id ID :prompt P)
;;       add a turn asking P to the session held in memory, save
;;   (:op header :id ID :title TITLE :tool TOOL :decision D)
;;       read session ID, set its title and an approval override, save
;;   (:op messages)           what was said in the echo area since the last ask
;;   (:op sessions)           every session magent lists, read by magent from
;;                            disk after a restart: one line each,
;;                            ID<TAB>TITLE<TAB>PARENT<TAB>OVERRIDES<TAB>INPUT...
;;   (:op quit)
;;
;; Every save is followed by `magent-store-flush' of the session: when
;; the answer comes, its events are on disk.

;;; Code:

(require 'cl-lib)
(require 'subr-x)

;; `emacs -Q' does not activate Debian's elpa-epc: put it on the path.
(unless (locate-library "epc")
  (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path dir)))
(require 'magent-store-test-upstream)
(magent-store-test-upstream-load)
(require 'magent-store-magent)

(defvar magent-session-directory)
(defvar magent-session--current-scope)
(defvar magent-session--metadata-cache)
(defvar magent-session--loaded-sessions)
(defvar magent-session--scoped-sessions)
(defvar magent-store-magent--export-offered)

(defvar machine-driver--dir (file-name-as-directory (nth 0 command-line-args-left))
  "Where requests come and answers go.")

(setq magent-session-directory (nth 1 command-line-args-left)
      magent-store-root nil
      magent-store-python (nth 2 command-line-args-left)
      magent-store-flush-interval 0.05
      command-line-args-left nil)

(defvar machine-driver--held (make-hash-table :test #'equal)
  "Sessions kept in memory: id -> session.")

(defvar machine-driver--messages nil
  "What was said in the echo area since the last `messages' request, newest first.")

(defun machine-driver--record (format-string &rest args)
  "Keep the message of FORMAT-STRING and ARGS."
  (when format-string
    (push (apply #'format-message format-string args) machine-driver--messages)))

(advice-add 'message :before #'machine-driver--record)

(defun machine-driver--answer (n text)
  "Answer request N with TEXT, whole."
  (let ((tmp (expand-file-name (format ".resp-%d" n) machine-driver--dir)))
    (let ((coding-system-for-write 'utf-8-unix))
      (with-temp-file tmp (insert text)))
    (rename-file tmp (expand-file-name (format "resp-%d" n) machine-driver--dir) t)))

(defun machine-driver--add-turn (session prompt)
  "Play one completed turn asking PROMPT in SESSION, as magent records one."
  (let* ((thread (magent-session-thread-ledger session))
         (turn (magent-thread-queue-turn thread prompt))
         (turn-id (magent-thread-turn-id turn)))
    (magent-thread-start-turn thread turn-id)
    (let ((item (magent-thread-start-item thread turn-id 'message :role 'assistant)))
      (magent-thread-append-item-content thread item (concat "answer to " prompt))
      (magent-thread-complete-item thread item
                                   :content (magent-thread-item-content item)))
    (magent-thread-complete-turn thread turn-id '(:input-tokens 3))))

(defun machine-driver--file (id)
  "The header file of global session ID."
  (expand-file-name (concat "global/" id ".json") magent-session-directory))

(defun machine-driver--read (id)
  "Session ID, read by magent from disk."
  (let ((session (plist-get (magent-session-read-file (machine-driver--file id)) :session)))
    (or session (error "magent cannot read session %s" id))))

(defun machine-driver--save (session)
  "Save SESSION as magent does, then flush it to disk."
  (magent-session-save-for-session session 'global)
  (magent-store-flush (magent-session-id session)))

(defun machine-driver--forget ()
  "Stop the backend and forget what Emacs and magent held, as a restart does."
  (magent-store-stop)
  (clrhash magent-session--metadata-cache)
  (clrhash magent-session--loaded-sessions)
  (clrhash magent-session--scoped-sessions))

(defun machine-driver--clean (text)
  "TEXT on one line, without tabs."
  (replace-regexp-in-string "[\t\n]" " " (format "%s" (or text ""))))

(defun machine-driver--sessions ()
  "Every session magent lists: lines of id, title, parent, overrides, turn inputs."
  (machine-driver--forget)
  (mapconcat
   (lambda (file)
     (let* ((read (magent-session-read-file file))
            (session (plist-get read :session)))
       (if (not session)
           (format "%s\tUNREADABLE" file)
         (mapconcat #'machine-driver--clean
                    (append (list (magent-session-id session)
                                  (magent-session-metadata-value session 'title)
                                  (magent-session-metadata-value session 'parent-session-id)
                                  (format "%S" (magent-session-approval-overrides session)))
                            (mapcar #'magent-thread-turn-input
                                    (magent-thread-turns
                                     (magent-session-thread-ledger session))))
                    "\t"))))
   (sort (magent-session-list-files) #'string<)
   "\n"))

(defun machine-driver--do (request)
  "Carry out REQUEST; return the answer's text."
  (let ((id (plist-get request :id)))
    (pcase (plist-get request :op)
      ('new
       (let ((session (magent-session-create
                       :id id :metadata `((title . ,(plist-get request :title)))))
             (magent-session--current-scope 'global))
         (magent-session-thread-ledger session)
         (machine-driver--add-turn session (plist-get request :prompt))
         (machine-driver--save session)
         "saved"))
      ('turn
       (let ((session (machine-driver--read id)))
         (machine-driver--add-turn session (plist-get request :prompt))
         (machine-driver--save session)
         "saved"))
      ('hold
       (puthash id (machine-driver--read id) machine-driver--held)
       "held")
      ('held-turn
       (let ((session (or (gethash id machine-driver--held) (error "session %s not held" id))))
         (machine-driver--add-turn session (plist-get request :prompt))
         (machine-driver--save session)
         "saved"))
      ('header
       (let ((session (machine-driver--read id)))
         (magent-session-set-metadata-value session 'title (plist-get request :title))
         (magent-session-set-approval-override session (intern (plist-get request :tool))
                                               (intern (plist-get request :decision)))
         (machine-driver--save session)
         "saved"))
      ('messages
       (prog1 (mapconcat #'identity (reverse machine-driver--messages) "\n")
         (setq machine-driver--messages nil)))
      ('sessions (machine-driver--sessions)))))

(defun machine-driver--loop ()
  "Answer requests until one says quit."
  (let ((n 0) (quit nil))
    (magent-store-mode 1)
    (while (not quit)
      (let ((file (expand-file-name (format "req-%d" (1+ n)) machine-driver--dir)))
        (if (not (file-exists-p file))
            (accept-process-output nil 0.005)
          (setq n (1+ n))
          (let ((request (with-temp-buffer
                           (insert-file-contents file)
                           (read (current-buffer)))))
            (if (eq (plist-get request :op) 'quit)
                (setq quit t)
              (machine-driver--answer
               n (condition-case err
                     (machine-driver--do request)
                   (error (format "error: %s" (error-message-string err))))))))))
    (let ((magent-store-magent--export-offered t))
      (magent-store-mode -1))
    (ignore-errors (magent-store-stop))
    (machine-driver--answer (1+ n) "bye")))

(machine-driver--loop)

;;; machine-driver.el ends here
