;;; magent-store-relocate-tests.el --- ERT tests for M-x magent-store-relocate  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions of a project are written through the shim to a real backend,
;; the project's folder "moves", and M-x magent-store-relocate moves them
;; with the real `magent-store relocate' process, as a user's Emacs does;
;; the backend then opens them under the new root.  That magent's own
;; readers find them there is tested against upstream magent in
;; upstream/magent-store-relocate-magent-tests.el.

;;; Code:

(require 'ert)
(require 'magent-store-test)
(require 'magent-store-relocate)

(defun magent-store-relocate-test--write (session-id project chunks)
  "Write session SESSION-ID of PROJECT, its reply streaming CHUNKS; close it."
  (magent-store-open session-id project)
  (magent-store-test--start-turn session-id)
  (dolist (chunk chunks)
    (magent-store-append-item-content session-id "item-1" chunk))
  (magent-store-close session-id))

(defun magent-store-relocate-test--wait (process)
  "Wait until PROCESS has exited and its sentinel has run."
  (with-timeout (60 (error "The relocation did not finish"))
    (while (or (process-live-p process) magent-store-relocate--process)
      (accept-process-output nil 0.05))))

(defun magent-store-relocate-test--directory (project)
  "Return the folder magent keeps PROJECT's sessions in."
  (expand-file-name (concat "projects/" (secure-hash 'sha1 project)) magent-store-root))

(defun magent-store-relocate-test--lock (session project)
  "Return the lock of SESSION of PROJECT, where this machine keeps it.
That is outside the session root, in the backend's state directory: a
folder named from the digest of the root's true name, laid out as the
root is."
  (let* ((root (file-truename (directory-file-name magent-store-root)))
         (key (substring (secure-hash 'sha256 (encode-coding-string root 'utf-8)) 0 32)))
    (expand-file-name (concat session ".lock")
                      (expand-file-name (concat "magent-store/roots/" key "/projects/"
                                                (secure-hash 'sha1 project))
                                        (getenv "XDG_STATE_HOME")))))

(defmacro magent-store-relocate-test--with-projects (&rest body)
  "Run BODY with a backend and folders OLD (gone), NEW and OTHER bound.
Sessions s1 and s2 belong to OLD, s3 to OTHER (whose folder exists)."
  (declare (indent 0) (debug t))
  `(magent-store-test--with-backend
     (let* ((base (file-truename (make-temp-file "magent-store-projects-" t)))
            (old (expand-file-name "old-name" base))
            (new (expand-file-name "new-name ü" base))
            (other (expand-file-name "other" base)))
       (make-directory other)
       (unwind-protect
           (progn
             (magent-store-relocate-test--write "s1" old '("first " "reply"))
             (magent-store-relocate-test--write "s2" old '("second reply"))
             (magent-store-relocate-test--write "s3" other '("elsewhere"))
             ,@body)
         (delete-directory base t)))))

(ert-deftest magent-store-relocate-lists-projects-whose-folder-is-gone-first ()
  "Projects come from the headers, with their session count; missing folders first."
  (magent-store-relocate-test--with-projects
    (should (equal (magent-store-relocate-projects)
                   (list (list old 2 t) (list other 1 nil))))))

(ert-deftest magent-store-relocate-moves-after-asking-and-the-backend-opens-them-there ()
  "It asks with the number of sessions, runs asynchronously, and the sessions open at NEW."
  (magent-store-relocate-test--with-projects
    (let* ((prompts nil)
           (messages nil)
           (process (cl-letf (((symbol-function 'yes-or-no-p)
                               (lambda (prompt) (push prompt prompts) t)))
                      (magent-store-relocate old new))))
      ;; Asynchronous: the move runs in its own process.
      (should (process-live-p process))
      (should (equal prompts (list (format "Move 2 sessions of %s to %s (a copy is kept first)? "
                                           old new))))
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args) (push (apply #'format-message format args) messages))))
        (magent-store-relocate-test--wait process))
      (should (string-match-p "2 sessions moved and verified" (car messages)))
      (should-not (file-exists-p (magent-store-relocate-test--directory old)))
      (should (file-exists-p (expand-file-name "s1.json" (magent-store-relocate-test--directory new))))
      ;; The backend opens them where magent now looks, with all they held.
      (let ((loaded (magent-store-load "s1" new)))
        (should (equal (alist-get 'project-root (plist-get loaded :header)) new))
        (should (equal (alist-get 'scope (plist-get loaded :snapshot)) new))
        (should (equal (magent-store-test--content loaded) "first reply")))
      (should (equal (magent-store-relocate-projects)
                     (list (list new 2 t) (list other 1 nil)))))))

(ert-deftest magent-store-relocate-reads-the-project-with-its-session-count ()
  "The project to move is read with each one's count of sessions, in words,
and whether its folder is gone; with no project, it says so."
  (magent-store-relocate-test--with-projects
    (let* ((annotations nil)
           (completing-read-function
            (lambda (_prompt table &rest _)
              (let ((annotate (alist-get 'annotation-function
                                         (cdr (funcall table "" nil 'metadata)))))
                (setq annotations (mapcar (lambda (c) (concat c (funcall annotate c)))
                                          (all-completions "" table))))
              other)))
      (should (equal (magent-store-relocate--read-old (magent-store-relocate-projects)) other))
      (should (equal annotations
                     (list (concat old "  2 sessions, folder missing")
                           (concat other "  1 session")))))
    (should (string-match-p "\\`No project sessions under "
                            (cadr (should-error (magent-store-relocate--read-old nil)
                                                :type 'user-error))))))

(ert-deftest magent-store-relocate-one-at-a-time ()
  "While a relocation runs, another is refused, and nothing is asked."
  (magent-store-relocate-test--with-projects
    (let ((process (cl-letf (((symbol-function 'yes-or-no-p) (lambda (_prompt) t)))
                     (magent-store-relocate old new))))
      (unwind-protect
          (progn
            ;; Held still: it is running when the second is asked for.
            (signal-process process 'SIGSTOP)
            (cl-letf (((symbol-function 'yes-or-no-p)
                       (lambda (_prompt) (error "Asked while a relocation runs"))))
              (should (equal (cadr (should-error (magent-store-relocate other new)
                                                 :type 'user-error))
                             "A relocation is still running"))))
        (signal-process process 'SIGCONT))
      (magent-store-relocate-test--wait process))))

(ert-deftest magent-store-relocate-declined-moves-nothing ()
  "Answering no starts nothing and changes nothing."
  (magent-store-relocate-test--with-projects
    (let ((before (directory-files-recursively magent-store-root "")))
      (cl-letf (((symbol-function 'yes-or-no-p) (lambda (_prompt) nil)))
        (should-error (magent-store-relocate old new) :type 'user-error))
      (should-not magent-store-relocate--process)
      (should (equal (directory-files-recursively magent-store-root "") before)))))

(ert-deftest magent-store-relocate-closes-the-sessions-this-emacs-has-open-first ()
  "A session this Emacs's backend holds is flushed and closed, then moves; it opens at NEW."
  (magent-store-relocate-test--with-projects
    (magent-store-open "s2" old)
    (magent-store-test--start-turn "s2")
    (magent-store-append-item-content "s2" "item-1" " and more")  ; not flushed yet
    (let* ((messages nil)
           (process (cl-letf (((symbol-function 'yes-or-no-p) (lambda (_prompt) t)))
                      (magent-store-relocate old new))))
      (should-not (gethash "s2" magent-store--sessions))
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args) (push (apply #'format-message format args) messages))))
        (magent-store-relocate-test--wait process))
      (should (string-match-p "\\`magent-store: 2 sessions moved and verified" (car messages)))
      (should-not (file-exists-p (magent-store-relocate-test--directory old)))
      (should (equal (magent-store-test--content (magent-store-load "s2" new))
                     " and more")))))  ; queued when the move began: flushed first, then moved

(ert-deftest magent-store-relocate-a-session-another-process-holds-moves-nothing-and-says-why ()
  "While another process holds one session, nothing moves; the message and buffer name it."
  (magent-store-relocate-test--with-projects
    (let* ((lock (magent-store-relocate-test--lock "s2" old))
           (holder (make-process :name "holder" :command (list "flock" lock "-c" "echo held; exec sleep 60")
                                 :buffer (generate-new-buffer " *holder*") :noquery t))
           (messages nil)
           (shown nil))
      (unwind-protect
          (progn
            (with-timeout (30 (error "The lock was not taken"))
              (while (not (string-match-p "held" (with-current-buffer (process-buffer holder)
                                                   (buffer-string))))
                (accept-process-output holder 0.05)))
            (let ((process (cl-letf (((symbol-function 'yes-or-no-p) (lambda (_prompt) t)))
                             (magent-store-relocate old new))))
              (cl-letf (((symbol-function 'message)
                         (lambda (format &rest args) (push (apply #'format-message format args) messages)))
                        ((symbol-function 'display-buffer)
                         (lambda (buffer &rest _) (push buffer shown))))
                (magent-store-relocate-test--wait process))))
        (delete-process holder))
      (should (string-match-p "\\`magent-store: the sessions were not moved: nothing moved" (car messages)))
      (should-not (string-match-p "magent-store:.*magent-store:" (car messages)))
      (should (equal shown (list (get-buffer magent-store-relocate-buffer))))
      (with-current-buffer magent-store-relocate-buffer
        (should (string-match-p "locked: s2" (buffer-string))))
      (should (file-exists-p (expand-file-name "s1.json" (magent-store-relocate-test--directory old))))
      (should-not (file-exists-p (magent-store-relocate-test--directory new))))))

(ert-deftest magent-store-relocate-refuses-the-project-it-would-move-to ()
  "Moving a project onto itself is refused before anything runs."
  (magent-store-relocate-test--with-projects
    (should-error (magent-store-relocate old (file-name-as-directory old)) :type 'user-error)
    (should-error (magent-store-relocate (expand-file-name "none" base) new) :type 'user-error)
    (should-not magent-store-relocate--process)))

(ert-deftest magent-store-relocate-is-a-command-once-the-core-is-loaded ()
  "Loading magent-store makes M-x magent-store-relocate available, its file loaded on use."
  (with-temp-buffer
    (should (eq 0 (call-process
                   (expand-file-name invocation-name invocation-directory) nil t nil
                   "--batch" "-Q" "-L" (file-name-directory (locate-library "magent-store"))
                   "-L" (file-name-directory (locate-library "epc"))
                   "--eval" "(setq load-prefer-newer t)"
                   "-l" "magent-store"
                   "--eval" "(princ (list (commandp 'magent-store-relocate) \
(autoloadp (symbol-function 'magent-store-relocate))))")))
    (should (string-match-p "(t t)\\'" (buffer-string)))))

(provide 'magent-store-relocate-tests)
;;; magent-store-relocate-tests.el ends here
