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
(require 'magent-store-test-upstream)
(require 'magent-store-test-backend)
(require 'magent-store-magent)
(when (magent-store-test-upstream-available-p)
  (magent-store-test-upstream-load)
  (require 'magent-agent-job))

(defvar magent-session-directory)
(defvar magent-session--metadata-cache)
(defvar magent-session--loaded-sessions)
(defvar magent-session--scoped-sessions)
(defvar magent-session-schema-version)
(defvar magent-session--current-scope)
(defvar magent-session-log-max-events)

(defconst magent-store-resume-test--here
  (file-name-directory (or load-file-name buffer-file-name))
  "This file's folder.")

(defmacro magent-store-resume-test--with-magent (&rest body)
  "Run BODY with the mode on, a private session root and a real backend."
  (declare (indent 0) (debug t))
  `(magent-store-test-with-backend
       ((magent-session-directory (expand-file-name "sessions" tmp))
        (magent-store-root nil)
        (magent-store-flush-interval 0.05)
        (magent-store-magent--export-offered nil)
        (magent-session--metadata-cache (make-hash-table :test #'equal))
        (magent-session--loaded-sessions (make-hash-table :test #'eq))
        (magent-session--scoped-sessions (make-hash-table :test #'equal)))
     (magent-store-mode 1)
     (unwind-protect
         (progn ,@body)
       (magent-store-mode -1))))

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
                  :id id :metadata '((title . "Résumé test"))))
        (magent-session--current-scope (or scope 'global)))
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
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((id "20261130-120000-a")
           (session (magent-store-resume-test--new-session id))
           (own (magent-store-resume-test--own-save session 'global))
           (file (expand-file-name (concat "global/" id ".json")
                                   magent-session-directory)))
      (magent-store-resume-test--restart)
      (should (eql (magent-store-magent--file-schema file) 7))
      (should (eql (magent-store-magent--file-schema own) 6))
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

(defvar magent-action-session-directory)

(ert-deftest magent-store-resume-every-scope-reads-back-as-magent-shows-it ()
  "A project and an action session list and read as magent's own files do."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((magent-action-session-directory nil)
           (project (file-truename (file-name-directory magent-session-directory)))
           (action-id "20261130-170000-act")
           (action (magent-session-action-scope action-id "my action/ünï" project))
           (p (magent-store-resume-test--new-session "20261130-170000-prj" project))
           (a (let ((session (magent-session-create :id action-id))
                    (magent-session--current-scope action))
                (dolist (entry `((kind . "action") (action . "my action/ünï")
                                 (title . "Review") (status . "running")
                                 (origin-scope . ,project)))
                  (magent-session-set-metadata-value session (car entry) (cdr entry)))
                (magent-session-thread-ledger session)
                (magent-store-resume-test--converse session 1)
                (magent-session-save-for-session session action)
                session))
           (own (list (magent-store-resume-test--own-save p project)
                      (magent-store-resume-test--own-save a action)))
           (files (list (expand-file-name "20261130-170000-prj.json"
                                          (magent-session--scope-storage-directory
                                           project))
                        (expand-file-name (concat "actions/my-action-ünï/"
                                                  action-id ".json")
                                          magent-session-directory))))
      (magent-store-resume-test--restart)
      (should (eql (magent-store-magent--file-schema (cadr files)) 7))
      (should (equal (magent-session-list-files) (list (car files))))
      (should (equal (magent-session-list-files-for-scope project)
                     (list (car files))))
      (should (equal (magent-session-list-action-files) (list (cadr files))))
      (should (equal (magent-session-list-action-files "my action/ünï")
                     (list (cadr files))))
      (cl-loop for file in files for own-file in own
               do (ert-info ((file-name-base file))
                    (let ((meta (magent-session--read-file-metadata-cached file)))
                      (should (plist-get meta :valid))
                      (should (equal meta (magent-store-resume-test--own-metadata
                                           own-file))))
                    (let ((ours (magent-session-read-file file))
                          (theirs (magent-store-resume-test--own-read own-file)))
                      (should (equal (plist-get ours :scope)
                                     (plist-get theirs :scope)))
                      (should (equal (magent-store-resume-test--state
                                      (plist-get ours :session))
                                     (magent-store-resume-test--state
                                      (plist-get theirs :session))))))))))

;;;; A global session resumed twice

(ert-deftest magent-store-resume-twice-keeps-every-header-field ()
  "A global session resumed twice still saves its whole header.
After two round trips magent holds its origin scope as the string
\"global\" and builds a project header from it; the store keeps the
session's own scope and every other field."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((id "20261130-180000-tw")
           (file (expand-file-name (concat "global/" id ".json")
                                   magent-session-directory))
           (messages nil)
           (magent-store-last-error nil)
           (record (lambda (format &rest args)
                     (when format
                       (push (apply #'format-message format args) messages)))))
      (magent-store-resume-test--new-session id)
      (magent-store-resume-test--restart)
      (dotimes (_ 2)
        (let ((session (plist-get (magent-session-read-file file) :session)))
          (magent-store-resume-test--converse session 1)
          (magent-session-save-for-session session 'global))
        (magent-store-resume-test--restart))
      (let ((session (plist-get (magent-session-read-file file) :session)))
        (advice-add 'message :before record)
        (unwind-protect
            (progn
              (magent-session-set-approval-override session 'grep 'deny)
              (magent-session-set-metadata-value session 'status "reviewed")
              (magent-session-save-for-session session 'global))
          (advice-remove 'message record)))
      (magent-store-resume-test--restart)
      (let ((session (plist-get (magent-session-read-file file) :session)))
        (should (equal (magent-session-approval-overrides session)
                       '((grep . deny) (shell . allow))))
        (should (equal (magent-session-metadata-value session 'status)
                       "reviewed"))
        (should (= 4 (length (magent-thread-turns
                              (magent-session-thread-ledger session))))))
      (let ((header (json-parse-string
                     (with-temp-buffer (insert-file-contents file)
                                       (buffer-string))
                     :object-type 'alist)))
        (should (equal (alist-get 'scope header) "global"))
        (should (memq (alist-get 'project-root header) '(nil :null))))
      ;; Nothing was refused, so nothing had to be said.
      (should-not (cl-find-if (lambda (text) (string-match-p "refused" text))
                              messages))
      (should-not magent-store-last-error))))

;;;; A magent that reads schema 7 itself

;; The schema-7 design's magent-session.el (MAGENT_SESSION7) reads the
;; store's files itself: the mode only flushes first.  Its ledger is not
;; public: the stand-in of magent-store-magent-tests.el teaches the
;; release's ledger `item-content-appended', and
;; `magent-thread-journal-tail' (the last cons of the journal, where the
;; schema-7 reader notes what is already on disk) is defined while the
;; test runs when the release lacks it, as is the setting
;; `magent-session-log-max-events' (magent's default, 2000) its writer reads.

(ert-deftest magent-store-resume-under-schema-7-magent-reads-itself-after-a-flush ()
  "With magent reading schema 7, magent reads the files; the mode flushes first."
  (skip-unless (and (magent-store-test-upstream-available-p)
                    magent-store-test-upstream-session7))
  (require 'magent-store-magent-tests)
  (let ((tail-standin (not (fboundp 'magent-thread-journal-tail)))
        (magent-session-log-max-events
         (if (boundp 'magent-session-log-max-events)
             magent-session-log-max-events
           2000)))
   (when tail-standin
     (defalias 'magent-thread-journal-tail
       (lambda (thread) (last (magent-thread-journal thread)))))
   (unwind-protect
      (progn
        (magent-store-magent-test--use-magent 7)
        (should (eql magent-session-schema-version 7))
        (magent-store-magent-test--with-content-event
          (magent-store-resume-test--with-magent
            (let* ((id "20261130-160000-s7")
                   (session (magent-store-resume-test--new-session id))
                   (file (expand-file-name (concat "global/" id ".json")
                                           magent-session-directory))
                   (thread (magent-session-thread-ledger session))
                   (renders 0)
                   (count (lambda (&rest _) (cl-incf renders))))
              ;; A reply still streaming: chunks Emacs has not sent yet.
              (let* ((turn (magent-thread-queue-turn thread "Still streaming?"))
                     (turn-id (magent-thread-turn-id turn)))
                (magent-thread-start-turn thread turn-id)
                (magent-thread-append-item-content
                 thread (magent-thread-start-item thread turn-id 'message
                                                  :role 'assistant)
                 "not sent yet"))
              (should (> (magent-store--session-fill
                          (gethash id magent-store--sessions))
                         0))
              (let ((own (magent-store-resume-test--own-save session 'global)))
                (advice-add 'magent-store-magent--call-rendered :before count)
                (unwind-protect
                    (progn
                      (let ((calls nil))
                        (cl-letf* ((call (symbol-function 'magent-store-call))
                                   ((symbol-function 'magent-store-call)
                                    (lambda (method args) (push method calls)
                                      (funcall call method args))))
                          (should (equal (magent-session-list-files) (list file))))
                        ;; Nor listed for it: it reads the headers itself.
                        (should-not (member "listing" calls)))
                      (let ((meta (magent-session--read-file-metadata-cached file)))
                        (should (plist-get meta :valid))
                        (should (equal (plist-get meta :summary-title)
                                       "Résumé test")))
                      (let ((after (plist-get (magent-session-read-file file)
                                              :session)))
                        (should after)
                        (should (equal (magent-store-resume-test--state after)
                                       (magent-store-resume-test--state
                                        (plist-get
                                         (magent-store-resume-test--own-read own)
                                         :session))))
                        (should (equal (magent-thread-item-content
                                        (car (magent-thread-turn-items
                                              (car (last (magent-thread-turns
                                                          (magent-session-thread-ledger
                                                           after)))))))
                                       "not sent yet"))))
                  (advice-remove 'magent-store-magent--call-rendered count)))
              ;; magent read the files itself: nothing was rendered for it.
              (should (= renders 0))))))
    (magent-store-magent-test--use-magent 6)
    (when tail-standin (fmakunbound 'magent-thread-journal-tail)))))

;;;; Emacs killed in the middle of a streamed reply

(defun magent-store-resume-test--wait (predicate seconds)
  "Wait up to SECONDS for PREDICATE to return non-nil; return its value."
  (let ((deadline (+ (float-time) seconds)) value)
    (while (and (not (setq value (funcall predicate)))
                (< (float-time) deadline))
      (accept-process-output nil 0.05))
    value))

(defun magent-store-resume-test--progress (file)
  "Return the chunks the child recorded in FILE, as (INDEX . TIME), in order."
  (when (file-exists-p file)
    (with-temp-buffer
      (insert-file-contents file)
      (let (out)
        (while (re-search-forward "^\\([0-9]+\\) \\([0-9.]+\\)$" nil t)
          (push (cons (string-to-number (match-string 1))
                      (string-to-number (match-string 2)))
                out))
        (nreverse out)))))

(ert-deftest magent-store-resume-after-emacs-is-killed-mid-stream ()
  "A fresh Emacs resumes everything up to the last flush; magent reconciles the rest."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((progress (expand-file-name "progress" (file-name-directory
                                                   magent-session-directory)))
           (file (expand-file-name "global/20261130-130000-crash.json"
                                   magent-session-directory))
           (lock (concat (file-name-sans-extension file) ".lock"))
           (process-environment
            (append (list (concat "RESUME_ROOT=" magent-session-directory)
                          (concat "RESUME_PROGRESS=" progress)
                          (concat "RESUME_PYTHON=" magent-store-python))
                    process-environment))
           (child (make-process
                   :name "magent-store-resume-child" :noquery t
                   :buffer (generate-new-buffer " *resume-child*")
                   :command (list (expand-file-name invocation-name
                                                    invocation-directory)
                                  "--batch" "-Q" "-L" (expand-file-name
                                                       "../../../elisp"
                                                       magent-store-resume-test--here)
                                  "-L" (expand-file-name ".." magent-store-resume-test--here)
                                  "-l" (expand-file-name
                                        "magent-store-resume-crash-child.el"
                                        magent-store-resume-test--here))))
           killed-at)
      (unwind-protect
          (progn
            (should (magent-store-resume-test--wait
                     (lambda () (>= (length (magent-store-resume-test--progress
                                             progress))
                                    60))
                     120))
            (signal-process child 'SIGKILL)
            (setq killed-at (float-time))
            (should (magent-store-resume-test--wait
                     (lambda () (not (process-live-p child))) 10)))
        (when (process-live-p child) (kill-process child))
        (kill-buffer (process-buffer child)))
      ;; The dead Emacs's backend sees its Emacs gone and exits.
      (should (magent-store-resume-test--wait
               (lambda () (not (file-exists-p lock))) 30))
      (let* ((sent (magent-store-resume-test--progress progress))
             (loaded (magent-session-read-file file))
             (session (plist-get loaded :session))
             (thread (magent-session-thread-ledger session))
             (turn (cadr (magent-thread-turns thread)))
             (item (car (magent-thread-turn-items turn)))
             (content (magent-thread-item-content item))
             (chunks (/ (length content) (length "chunk 0000 é\n")))
             (expected (mapconcat (lambda (n) (format "chunk %04d é\n" n))
                                  (number-sequence 0 (1- chunks)) "")))
        (message "Killed mid-stream: %d of the %d chunks sent came back"
                 chunks (length sent))
        (should (= 2 (length (magent-thread-turns thread))))
        (should (eq (magent-thread-turn-status turn) 'in-progress))
        ;; None corrupted: exactly the first CHUNKS chunks, whole.
        (should (equal content expected))
        ;; None lost but the last flush interval's (plus the time a loaded
        ;; machine takes to answer a flush).
        (should (>= chunks (length (cl-remove-if
                                    (lambda (entry)
                                      (> (cdr entry)
                                         (- killed-at (* 2 magent-store-flush-interval)
                                            0.5)))
                                    sent))))
        (should (<= chunks (length sent)))
        ;; magent's own reconciliation handles the interrupted turn, as for
        ;; its own files, and its save goes to the store.
        (magent-session-install 'global session)
        (should (eq (magent-thread-turn-status turn) 'interrupted))
        (should (eq (magent-thread-item-status item) 'cancelled))
        (magent-store-resume-test--restart)
        (let* ((again (plist-get (magent-session-read-file file) :session))
               (turn (cadr (magent-thread-turns
                            (magent-session-thread-ledger again)))))
          (should (eq (magent-thread-turn-status turn) 'interrupted))
          (should (equal (magent-thread-item-content
                          (car (magent-thread-turn-items turn)))
                         expected))
          (should (equal (magent-thread-turn-input
                          (car (magent-thread-turns
                                (magent-session-thread-ledger again))))
                         "First question")))))))

;;;; Damaged sessions

(defvar magent-store-magent--damage-told)

(defvar magent-store-resume-test--messages nil
  "Messages shown while a test runs.")

(defun magent-store-resume-test--record-message (format-string &rest args)
  "Record the message of FORMAT-STRING and ARGS."
  (when format-string
    (push (apply #'format-message format-string args)
          magent-store-resume-test--messages)))

(defun magent-store-resume-test--file-lines (file)
  "Return FILE's lines, each with its newline."
  (with-temp-buffer
    (insert-file-contents-literally file)
    (split-string (buffer-string) "^" t)))

(ert-deftest magent-store-resume-damaged-sessions-are-listed-and-read ()
  "A torn log, a missing snapshot, a header alone: listed as damaged, read as far as can be."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let ((files (mapcar (lambda (id)
                           (magent-store-resume-test--new-session id)
                           (cons id (expand-file-name (concat "global/" id ".json")
                                                      magent-session-directory)))
                         '("torn" "gone" "bare" "fine"))))
      (magent-store-resume-test--restart)
      (let ((base (lambda (id) (file-name-sans-extension (cdr (assoc id files))))))
        ;; The last write cut off by a crash.
        (write-region "{\"seq\":99,\"type\":\"turn-q" nil
                      (concat (funcall base "torn") ".jsonl") t 'silent)
        ;; The snapshot lost, and the log no longer starting at the beginning.
        (delete-file (concat (funcall base "gone") ".snapshot"))
        (let ((log (concat (funcall base "gone") ".jsonl")))
          (with-temp-file log
            (set-buffer-multibyte nil)
            (apply #'insert (nthcdr 3 (magent-store-resume-test--file-lines log)))))
        ;; Only the header.
        (delete-file (concat (funcall base "bare") ".snapshot"))
        (delete-file (concat (funcall base "bare") ".jsonl")))
      (should (equal (sort (magent-session-list-files) #'string<)
                     (sort (mapcar #'cdr files) #'string<)))
      (pcase-dolist (`(,id ,label ,turns)
                     '(("torn" "[damaged: torn log] Résumé test" 2)
                       ("gone" "[damaged: snapshot missing, earliest events gone] Résumé test" 0)
                       ("bare" "[damaged: no conversation saved] Résumé test" 0)
                       ("fine" "Résumé test" 2)))
        (ert-info ((format "session %s" id))
          (let* ((file (cdr (assoc id files)))
                 (meta (magent-session--read-file-metadata-cached file))
                 (magent-store-magent--damage-told nil)
                 (magent-store-resume-test--messages nil)
                 (loaded (progn
                           (advice-add 'message :before
                                       #'magent-store-resume-test--record-message)
                           (unwind-protect
                               (progn (magent-session-read-file file)
                                      (magent-session-read-file file))
                             (advice-remove 'message
                                            #'magent-store-resume-test--record-message)))))
            (should (plist-get meta :valid))
            (should (equal (plist-get meta :summary-title) label))
            ;; Its title says so too.
            (should (equal (plist-get meta :title) label))
            ;; Read twice, a damaged session is said to be once.
            (should (equal (cl-remove-if-not
                            (lambda (m) (string-match-p "is damaged" m))
                            magent-store-resume-test--messages)
                           (and (not (equal id "fine"))
                                (list (format-message "magent-store: session %s is damaged (%s); \
showing what could be read.  `magent-store fsck --repair' repairs what it can"
                                              id (substring label 10 (string-search "]" label)))))))
            (should (equal (plist-get meta :status)
                           (and (not (equal id "fine")) "damaged")))
            (should (equal (plist-get loaded :id) id))
            (should (= turns (length (magent-thread-turns
                                      (magent-session-thread-ledger
                                       (plist-get loaded :session))))))))))))

;;;; Leaving: sessions written back for magent's release

(ert-deftest magent-store-resume-leaving-writes-sessions-back-for-magent ()
  "Turning the mode off says so once; the export gives magent its own files back."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((project (file-truename (file-name-directory magent-session-directory)))
           (a (magent-store-resume-test--new-session "20261130-140000-a"))
           (b (magent-store-resume-test--new-session "20261130-140000-b" project))
           (own (list (magent-store-resume-test--own-save a 'global)
                      (magent-store-resume-test--own-save b project)))
           (files (list (expand-file-name "global/20261130-140000-a.json"
                                          magent-session-directory)
                        (magent-session--scope-storage-directory project)))
           (magent-store-resume-test--messages nil))
      (setcar (cdr files) (expand-file-name "20261130-140000-b.json" (cadr files)))
      (magent-store-resume-test--restart)
      (advice-add 'message :before #'magent-store-resume-test--record-message)
      (unwind-protect
          (progn
            (magent-store-mode -1)
            (magent-store-mode 1)
            (magent-store-mode -1))
        (advice-remove 'message #'magent-store-resume-test--record-message))
      (should (equal (cl-remove-if-not
                      (lambda (m) (string-match-p "format this magent cannot read" m))
                      magent-store-resume-test--messages)
                     '("magent-store: 2 sessions are stored in a format this magent \
cannot read; M-x magent-store-export-for-magent writes them back")))
      ;; With the mode off, magent cannot read them.
      (should-not (magent-session-list-files))
      (let ((summary (magent-store-export-for-magent)))
        (should (string-match-p "2 written back and value-identical" summary)))
      (dolist (file files)
        (should (eql (magent-store-magent--file-schema file) 6))
        (should-not (file-exists-p (concat (file-name-sans-extension file) ".jsonl"))))
      (should (= 2 (length (file-expand-wildcards
                            (expand-file-name "schema7-backup-*/*/*.json*"
                                              magent-session-directory)))))
      ;; magent reads its own files again: the sessions it held.
      (clrhash magent-session--metadata-cache)
      (should (equal (sort (magent-session-list-files) #'string<)
                     (sort (copy-sequence files) #'string<)))
      (cl-loop for file in files for own-file in own
               do (should (equal (magent-store-resume-test--state
                                  (plist-get (magent-session-read-file file) :session))
                                 (magent-store-resume-test--state
                                  (plist-get (magent-store-resume-test--own-read
                                              own-file)
                                             :session)))))
      ;; Again: nothing to do, nothing changed.
      (let ((before (mapcar (lambda (f) (file-attribute-modification-time
                                         (file-attributes f)))
                            files)))
        (should (string-match-p "0 written back"
                                (magent-store-export-for-magent)))
        (should (equal before (mapcar (lambda (f) (file-attribute-modification-time
                                                   (file-attributes f)))
                                      files)))))))

(ert-deftest magent-store-resume-export-turns-the-mode-off-and-says-so-last ()
  "The export, run with the mode on, turns it off and says so in its last
message, not that sessions need writing back; toggling the mode afterwards
asks before taking the sessions over again."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let ((magent-store-resume-test--messages nil)
          (magent-store-magent--exported nil)
          (file (expand-file-name "global/20261130-150000-e.json"
                                  magent-session-directory))
          (asked nil))
      (magent-store-resume-test--new-session "20261130-150000-e")
      (should magent-store-mode)
      (advice-add 'message :before #'magent-store-resume-test--record-message)
      (unwind-protect
          (magent-store-export-for-magent)
        (advice-remove 'message #'magent-store-resume-test--record-message))
      (should-not magent-store-mode)
      (should (eql (magent-store-magent--file-schema file) 6))
      (should-not (cl-find-if (lambda (m) (string-match-p "cannot read" m))
                              magent-store-resume-test--messages))
      (should (string-match-p
               "1 written back.*; magent-store-mode is off: magent saves its own files again"
               (car magent-store-resume-test--messages)))
      ;; Its progress was shown, and ended.
      (should (member "magent-store: writing sessions back...done"
                      magent-store-resume-test--messages))
      ;; M-x magent-store-mode, meant to turn it off: asked, and it stays off.
      (cl-letf (((symbol-function 'y-or-n-p)
                 (lambda (prompt) (setq asked prompt) nil)))
        (call-interactively #'magent-store-mode))
      (should (string-match-p "turn it on again" asked))
      (should-not magent-store-mode)
      (should-not (advice-member-p #'magent-store-magent--around-save
                                   'magent-session-save-for-session))
      ;; Turned on on purpose (with an argument, or from Lisp): no question.
      (setq asked nil)
      (magent-store-mode 1)
      (should magent-store-mode)
      (should-not asked))))

(ert-deftest magent-store-resume-leaving-with-nothing-to-write-back-says-nothing ()
  "Turning the mode off when no session needs writing back offers nothing."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let ((magent-store-resume-test--messages nil))
      (advice-add 'message :before #'magent-store-resume-test--record-message)
      (unwind-protect
          (progn
            (magent-store-mode -1)
            ;; A session magent saves itself, with the mode off.
            (magent-store-resume-test--new-session "20261130-160000-o")
            (magent-store-mode 1)
            (magent-store-mode -1))
        (advice-remove 'message #'magent-store-resume-test--record-message))
      (should (eql (magent-store-magent--file-schema
                    (expand-file-name "global/20261130-160000-o.json"
                                      magent-session-directory))
                   6))
      (should-not (cl-find-if (lambda (m) (string-match-p "cannot read" m))
                              magent-store-resume-test--messages))
      (should-not magent-store-magent--export-offered))))

;;;; Continuing a session magent wrote before the mode was on

(defun magent-store-resume-test--turn-inputs (session)
  "Return the inputs of SESSION's turns, in order."
  (mapcar #'magent-thread-turn-input
          (magent-thread-turns (magent-session-thread-ledger session))))

(ert-deftest magent-store-resume-continues-a-session-magent-wrote ()
  "An old schema-6 session resumes, continues, and is taken over at the first write."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((root magent-session-directory)
           (old-file (expand-file-name "global/20261129-090000-old.json" root))
           (new-file (expand-file-name "global/20261130-090000-new.json" root))
           old-bytes)
      ;; Written by magent itself, before the mode was turned on.
      (magent-store-mode -1)
      (magent-store-resume-test--new-session "20261129-090000-old")
      (magent-store-mode 1)
      (setq old-bytes (with-temp-buffer
                        (set-buffer-multibyte nil)
                        (insert-file-contents-literally old-file)
                        (buffer-string)))
      (should (eql (magent-store-magent--file-schema old-file) 6))
      (magent-store-resume-test--new-session "20261130-090000-new")
      (magent-store-resume-test--restart)
      ;; Both kinds are listed together.
      (should (equal (sort (magent-session-list-files) #'string<)
                     (list old-file new-file)))
      ;; Resume the old one through magent, and continue it.
      (let* ((loaded (magent-session-read-file old-file))
             (session (plist-get loaded :session)))
        (should (equal (magent-store-resume-test--turn-inputs session)
                       '("Question 0: what is ünïcode? 🧪"
                         "Question 1: what is ünïcode? 🧪")))
        (magent-session-install (plist-get loaded :scope) session)
        (magent-store-resume-test--converse session 1 3)
        (magent-session-save-for-session session 'global))
      ;; The backend took it over: migrated in place, the original kept.
      (should (eql (magent-store-magent--file-schema old-file) 7))
      (let ((backup (car (file-expand-wildcards
                          (expand-file-name
                           "schema6-backup-*/global/20261129-090000-old.json"
                           root)))))
        (should backup)
        (should (equal (with-temp-buffer
                         (set-buffer-multibyte nil)
                         (insert-file-contents-literally backup)
                         (buffer-string))
                       old-bytes)))
      (magent-store-resume-test--restart)
      ;; After another restart: every old and new turn.
      (let ((session (plist-get (magent-session-read-file old-file) :session)))
        (should (equal (magent-store-resume-test--turn-inputs session)
                       '("Question 0: what is ünïcode? 🧪"
                         "Question 1: what is ünïcode? 🧪"
                         "Question 0: what is ünïcode? 🧪")))
        (should (equal (magent-thread-item-content
                        (car (magent-thread-turn-items
                              (car (last (magent-thread-turns
                                          (magent-session-thread-ledger
                                           session)))))))
                       "chunk 0 \"quoted\"\nchunk 1 \"quoted\"\nchunk 2 \"quoted\"\n"))
        (should (equal (magent-session-approval-overrides session)
                       '((shell . allow)))))
      (should (equal (sort (magent-session-list-files) #'string<)
                     (list old-file new-file))))))

(provide 'magent-store-resume-tests)
;;; magent-store-resume-tests.el ends here
