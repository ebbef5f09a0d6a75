;;; magent-store-magent-tests.el --- magent-store-mode under upstream magent  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store-mode' with upstream magent's own code loaded (from
;; MAGENT_LISP, and the schema-7 magent-session.el from MAGENT_SESSION7),
;; a real backend process, and turns driven through magent's own API:
;; `magent-thread-create-turn', `magent-thread-start-item',
;; `magent-thread-append-item-content', `magent-thread-complete-item',
;; ..., `magent-session-save-deferred-for-session' and
;; `magent-session-save-for-session'.  In every scope magent has (global,
;; a project root, an action session), with awkward streamed text,
;; reasoning, tool calls holding JSON false, null, {} and [], failed and
;; cancelled turns, agent jobs, approval overrides, a title, a session
;; saved mid-stream and (where the loaded magent can fork) a fork.
;;
;; The judges are magent's own functions: `magent-thread-snapshot-to-alist'
;; encoded by `magent-json-encode' for the snapshot; for the header,
;; magent's own save (schema 6, its snapshot and journal left aside) or
;; its header builder (schema 7); `magent-session--scope-storage-directory'
;; for where files land; and the schema-7 reader
;; (`magent-session--read-validated-data': header fields, log and
;; snapshot validation) followed by `magent-thread-replay'.
;;
;; Stand-in, said here as the issue asks: magent's ledger that applies
;; `item-content-appended' (new in schema 7) is not public.  While the
;; schema-7 reader runs, `magent-store-magent-test--with-content-event'
;; teaches the release's ledger that one event exactly as SPEC §1
;; defines it: payload keys `chunk' (a non-empty string) and `output'
;; (true or false), turn-id and item-id required; applying it appends
;; the chunk to the item's content (or output), null read as "", and
;; sets the item's and the thread's updated-at to the event's time.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'subr-x)

(require 'magent-store-test-backend)
(require 'magent-store-test-upstream)
(magent-store-test-upstream-load)
(require 'magent-store-magent)

(defconst magent-store-magent-test--release-session
  (locate-library "magent-session.el" t)
  "The release's magent-session.el, to load it back after schema 7.")

(defconst magent-store-magent-test--release-functions
  (let (names)
    (mapatoms (lambda (symbol)
                (when (and (fboundp symbol)
                           (string-prefix-p "magent-session"
                                            (symbol-name symbol)))
                  (push symbol names))))
    names)
  "The session functions of the release, to forget schema 7's after it.")

(defun magent-store-magent-test--use-magent (schema)
  "Load magent's session module of SCHEMA (6 or 7); return SCHEMA or nil.
nil when MAGENT_SESSION7 does not name a schema-7 magent-session.el."
  (cond ((= schema 6)
         (load magent-store-magent-test--release-session nil t t)
         (mapatoms (lambda (symbol)
                     (when (and (fboundp symbol)
                                (string-prefix-p "magent-session"
                                                 (symbol-name symbol))
                                (not (memq symbol magent-store-magent-test--release-functions)))
                       (fmakunbound symbol))))
         6)
        (magent-store-test-upstream-session7
         (load (expand-file-name "magent-session.el"
                                 magent-store-test-upstream-session7)
               nil t t)
         7)))

;;;; A private store and a real backend

(defmacro magent-store-magent-test--with-store (&rest body)
  "Run BODY with `magent-store-mode' on, a private session root and backend."
  (declare (indent 0) (debug t))
  `(magent-store-test-with-backend
       ((tmp (file-truename tmp))
        (process-environment
         (cons (concat "XDG_STATE_HOME=" (expand-file-name "state" tmp))
               process-environment))
        (magent-session-directory (expand-file-name "sessions" tmp))
        (magent-action-session-directory nil)
        (magent-store-root nil)
        (magent-store-magent--headers-sent (make-hash-table :test #'equal))
        (magent-store-magent--adapter-failures nil)
        (magent-store-magent--unencodable nil)
        (magent-store-magent--deferred-headers nil)
        (magent-store-magent--header-timer nil))
     (unwind-protect
         (progn (magent-store-mode 1) ,@body)
       (magent-store-mode -1))))

;;;; magent sessions, in magent's own ways

(defun magent-store-magent-test--project (name)
  "Return a project root NAME under the test's directory, as magent keys it."
  (let ((dir (expand-file-name name (file-name-directory
                                     (directory-file-name
                                      magent-session-directory)))))
    (make-directory dir t)
    (magent-session--normalize-project-root dir)))

(defun magent-store-magent-test--session (id scope &optional metadata)
  "Return a magent session ID whose thread is created under SCOPE."
  (let ((session (magent-session-create :id id))
        (magent-session--current-scope scope))
    (pcase-dolist (`(,key . ,value) metadata)
      (magent-session-set-metadata-value session key value))
    (magent-session-thread-ledger session)
    session))

(defun magent-store-magent-test--reply (session)
  "Start a turn in SESSION and an assistant reply in it, through magent.
Return (THREAD TURN-ID ITEM): the reply is streaming, nothing appended yet."
  (let* ((thread (magent-session-thread-ledger session))
         (turn-id (magent-thread-turn-id
                   (magent-thread-create-turn thread "hello"))))
    (list thread turn-id
          (magent-thread-start-item thread turn-id 'message
                                    :id "reply-1" :role 'assistant))))

(defun magent-store-magent-test--action (id name origin &optional parent)
  "Return a magent action session ID for action NAME from ORIGIN, and its scope.
Set up as magent's `magent-action-session-initialize' sets one up."
  (let ((scope (magent-session-action-scope id name origin)))
    (cons (magent-store-magent-test--session
           id scope
           `((kind . "action") (action . ,name)
             (title . ,(format "Action %s" name)) (status . "running")
             (session-policy . "isolated") (origin-scope . ,origin)
             (invocation-id . "inv-1")
             ,@(and parent `((parent-session-id . ,parent)))))
          scope)))

(defconst magent-store-magent-test--chunks
  (list "Hel" "lo, caf" "e" "\u0301 \u2028next" "\r\nline two\r" "\n😀👩\u200d"
        "💻 \u200fשלום\u200e, " "مرحبا." " Done")
  "Streamed text: a combining mark split from its letter, U+2028, CR LF
split across chunks, emoji (one joined across chunks), RTL marks.")

(defconst magent-store-magent-test--tool-args
  (list :pattern "needle" :case-sensitive :json-false :limit :null
        :paths [] :options nil :flags [t :json-false :null]
        :nested (list :deep [(:a 1 :b :json-false) (:c [])] :ratio 0.1)
        :name 'grep :unicode "é😀")
  "Tool arguments as magent parses them from a provider (false as
`:json-false', null as `:null', {} as nil, [] as [])."
  )

(defun magent-store-magent-test--stream (session scope thread item chunks
                                                 &optional output-p save-after)
  "Stream CHUNKS into ITEM of THREAD as magent does, a deferred save each.
After SAVE-AFTER chunks (if given), save SESSION under SCOPE synchronously."
  (let ((n 0))
    (dolist (chunk chunks)
      (magent-thread-append-item-content thread item chunk output-p)
      (magent-session-save-deferred-for-session session scope)
      (when (and (eql (cl-incf n) save-after) magent-store-mode)
        (magent-session-save-for-session session scope)
        ;; Mid-stream, the item's and the thread's times are the last
        ;; chunk's: the backend must hold them to the last digit.
        (magent-store-magent-test--should-equal
         (magent-store-magent-test--store-snapshot session scope)
         (magent-store-magent-test--magent-snapshot session))))))

(defun magent-store-magent-test--turn (session scope prompt outcome)
  "Play one turn of SESSION under SCOPE for PROMPT ending in OUTCOME.
OUTCOME is `completed', `failed' or `cancelled'."
  (let* ((thread (magent-session-thread-ledger session))
         (turn (magent-thread-create-turn thread prompt nil
                                          (list :source 'agent-run-turn)))
         (turn-id (magent-thread-turn-id turn))
         (chunks magent-store-magent-test--chunks))
    (magent-thread-record-user-message-if-needed
     thread turn-id prompt nil (list :source 'agent-run-turn))
    (magent-session-save-deferred-for-session session scope)
    (let ((reasoning (magent-thread-start-item thread turn-id 'reasoning
                                               :phase 'thinking)))
      (magent-store-magent-test--stream session scope thread reasoning
                                        '("Let me " "think…"))
      (magent-thread-complete-item thread reasoning :content "Let me think…"))
    (let ((assistant (magent-thread-start-item
                      thread turn-id 'message :role 'assistant
                      :metadata (list :model "m" :stream t :cached :json-false))))
      ;; Saved mid-stream: the header and what streamed so far are durable.
      (magent-store-magent-test--stream session scope thread assistant chunks
                                        nil 4)
      (if (eq outcome 'cancelled)
          (magent-thread-cancel-in-progress-items thread turn-id "Stopped")
        (magent-thread-complete-item thread assistant
                                     :content (apply #'concat chunks))))
    (unless (eq outcome 'cancelled)
      (let ((tool (magent-thread-start-item
                   thread turn-id 'tool :id (format "call-%s" turn-id)
                   :call-id (format "call-%s" turn-id) :name "grep"
                   :input magent-store-magent-test--tool-args)))
        (magent-store-magent-test--stream session scope thread tool
                                          '("match 1\n" "match 2\n") t)
        (if (eq outcome 'failed)
            (magent-thread-fail-item thread tool
                                     (list :message "exit 2" :code 2
                                           :retryable :json-false)
                                     :output "match 1\nmatch 2\n")
          (magent-thread-complete-item
           thread tool :output "match 1\nmatch 2\n"
           :metadata (list :exit-code 0 :truncated :json-false
                           :extra :null :empty nil :list [])))))
    (pcase outcome
      ('completed (magent-thread-complete-turn
                   thread turn-id (list :input-tokens 12 :output-tokens 34
                                        :cached :json-false :detail nil)))
      ('failed (magent-thread-fail-turn
                thread turn-id (list :message "provider said no"
                                     :status 500 :retry :null)))
      ('cancelled (magent-thread-interrupt-turn thread turn-id "User stopped")))
    (magent-session-save-deferred-for-session session scope)))

(defun magent-store-magent-test--decorate (session)
  "Give SESSION agent jobs and approval overrides, as magent records them."
  (magent-session-add-agent-job
   session (magent-agent-job-create
            :id "agent-1" :parent-session-id (magent-session-get-id session)
            :agent-name "explore" :task-name "find uses" :status 'running
            :prompt "Where is x used?"
            :transcript (list (list :role 'user :content "Where?")
                              (list :role 'assistant :content "Here."))
            :metadata (list :depth 1 :ok :json-false :none :null)))
  (magent-session-add-agent-job
   session (magent-agent-job-create
            :id "agent-2" :agent-name "fix" :status 'failed
            :error (list :message "no") :result nil))
  (magent-session-set-approval-override session 'bash 'allow)
  (magent-session-set-approval-override session 'write_file 'deny))

;;;; What magent holds, as magent writes it

(defun magent-store-magent-test--parse (text)
  "Parse JSON TEXT the same way for both sides of a comparison."
  (json-parse-string (if (multibyte-string-p text) text
                       (decode-coding-string text 'utf-8))
                     :object-type 'alist :null-object nil :false-object :json-false))

(defun magent-store-magent-test--without (alist &rest keys)
  "Return ALIST without KEYS."
  (cl-remove-if (lambda (entry) (memq (car entry) keys)) alist))

(defun magent-store-magent-test--magent-snapshot (session)
  "SESSION's thread as magent holds it, encoded by magent's own encoder."
  (magent-store-magent-test--without
   (magent-store-magent-test--parse
    (magent-json-encode (magent-thread-snapshot-to-alist
                         (magent-session-thread-ledger session))))
   'snapshot-created-at 'last-event-seq))

(defun magent-store-magent-test--store-snapshot (session scope)
  "SESSION's thread as the backend materialized it (under SCOPE)."
  (let ((id (magent-session-get-id session)))
    (magent-store-flush id)
    ;; `magent-store-load' parses as `magent-store-magent-test--parse' does.
    (magent-store-magent-test--without
     (plist-get (magent-store-load id (magent-store-magent--store-scope scope))
                :snapshot)
     'snapshot-created-at 'last-event-seq)))

(defun magent-store-magent-test--magent-header (session scope)
  "The header magent itself writes for SESSION under SCOPE, parsed.
Schema 7: magent's header builder and its encoder.  Schema 6: magent's
own save, into a scratch root, without its snapshot and journal."
  (if (fboundp 'magent-session--header-data-for-session)
      (magent-store-magent-test--parse
       (magent-session--json-text
        (magent-session--header-data-for-session session scope)))
    (let* ((magent-session-directory (make-temp-file "magent-own-" t))
           (save (advice--cd*r (indirect-function
                                'magent-session-save-for-session))))
      (unwind-protect
          (let ((file (funcall save session scope)))
            (with-temp-buffer
              (insert-file-contents file)
              (let ((data (magent-store-magent-test--parse (buffer-string))))
                (setf (alist-get 'schema-version data) 7)
                (magent-store-magent-test--without data 'snapshot 'journal))))
        (delete-directory magent-session-directory t)))))

(defun magent-store-magent-test--header-file (session scope)
  "Where magent puts SESSION's header under SCOPE."
  (expand-file-name (concat (magent-session-get-id session) ".json")
                    (magent-session--scope-storage-directory scope)))

(defun magent-store-magent-test--store-header (session scope)
  "The header file the backend wrote for SESSION under SCOPE, parsed."
  (magent-session-save-for-session session scope)
  (with-temp-buffer
    (let ((coding-system-for-read 'utf-8-unix))
      (insert-file-contents
       (magent-store-magent-test--header-file session scope)))
    (magent-store-magent-test--parse (buffer-string))))

(defun magent-store-magent-test--first-difference (a b &optional path)
  "Return the path and values where A and B first differ, or nil."
  (cond
   ((equal a b) nil)
   ((and (consp a) (consp b) (consp (car a)) (consp (car b))
         (equal (mapcar #'car a) (mapcar #'car b)))
    (cl-loop for (key . va) in a
             for vb = (alist-get key b)
             thereis (magent-store-magent-test--first-difference
                      va vb (cons key path))))
   ((and (vectorp a) (vectorp b) (= (length a) (length b)))
    (cl-loop for i below (length a)
             thereis (magent-store-magent-test--first-difference
                      (aref a i) (aref b i) (cons i path))))
   (t (list (reverse path) a b))))

(defmacro magent-store-magent-test--should-equal (store magent)
  "Check that STORE equals MAGENT, naming the first difference if not."
  `(let ((store ,store) (magent ,magent))
     (should (equal (magent-store-magent-test--first-difference store magent)
                    nil))))

;;;; The sessions every test plays

(defun magent-store-magent-test--fork (source)
  "Return a fork of SOURCE under the global scope.
magent's own `magent-session-fork' where the loaded magent can fork
\(its ledger has `magent-thread-journal-tail'); else what a fork starts
from: a new session whose thread is SOURCE's, copied through magent's
own snapshot functions, with history no event of the fork carries."
  (if (and (fboundp 'magent-session-fork)
           (fboundp 'magent-thread-journal-tail))
      (magent-session-fork source 'global)
    (let* ((source-id (magent-session-get-id source))
           (fork (magent-session-create
                  :id "s-fork"
                  :metadata `((parent-session-id . ,source-id))))
           (thread (magent-thread-snapshot-from-alist
                    (magent-thread-snapshot-to-alist
                     (magent-session-thread-ledger source)))))
      (setf (magent-thread-id thread) "s-fork"
            (magent-thread-session-id thread) "s-fork"
            (magent-thread-status thread) 'idle
            (magent-thread-created-at thread) (float-time)
            (magent-thread-metadata thread)
            (list :source 'magent :forked-from-session-id source-id)
            (magent-thread-journal thread) nil
            (magent-thread-last-event-seq thread) 0)
      (dolist (turn (magent-thread-turns thread))
        (setf (magent-thread-turn-thread-id turn) "s-fork"))
      (setf (magent-session-thread fork) thread)
      fork)))

(defun magent-store-magent-test--play ()
  "Play sessions in every scope; return ((SESSION . SCOPE) ...)."
  (let* ((root (magent-store-magent-test--project "projét ü"))
         (global (magent-store-magent-test--session
                  "s-global" 'global
                  '((title . "A long title: 長い題名が四十八桁を越えるとき、magent は省略します"))))
         (project (magent-store-magent-test--session "s-project" root))
         (action (magent-store-magent-test--action
                  "s-action" "my action/ünï" root "s-project"))
         (action-global (magent-store-magent-test--action
                         "s-action-2" 'review 'global))
         (sessions (list (cons global 'global) (cons project root)
                         action action-global)))
    (magent-store-magent-test--turn global 'global
                                    "First question, with\nnewlines" 'completed)
    (magent-store-magent-test--decorate global)
    (magent-store-magent-test--turn global 'global "Second" 'failed)
    (magent-store-magent-test--turn global 'global "Third" 'cancelled)
    (magent-store-magent-test--turn project root "  Project   question  " 'completed)
    (magent-store-magent-test--turn (car action) (cdr action) "Act" 'completed)
    (magent-session-set-metadata-value (car action) 'status "completed")
    (magent-store-magent-test--turn (car action-global) (cdr action-global)
                                    "Review" 'failed)
    (let ((fork (magent-store-magent-test--fork global)))
      (magent-store-magent-test--turn fork 'global "After the fork" 'completed)
      (push (cons fork 'global) sessions))
    (dolist (pair sessions)
      (magent-session-save-for-session (car pair) (cdr pair)))
    sessions))

;;;; 1, 2 and 5: snapshot, header, files, under the release (schema 6)

(defun magent-store-magent-test--check-sessions (sessions)
  "Check each of SESSIONS: snapshot, header and where its files are."
  (pcase-dolist (`(,session . ,scope) sessions)
    (ert-info ((format "session %s" (magent-session-get-id session)))
      (magent-store-magent-test--should-equal
       (magent-store-magent-test--store-snapshot session scope)
       (magent-store-magent-test--magent-snapshot session))
      (magent-store-magent-test--should-equal
       (magent-store-magent-test--store-header session scope)
       (magent-store-magent-test--magent-header session scope))
      (dolist (ext '(".json" ".jsonl" ".snapshot"))
        (should (file-exists-p
                 (concat (file-name-sans-extension
                          (magent-store-magent-test--header-file session scope))
                         ext)))))))

(ert-deftest magent-store-magent-sessions-are-written-as-magent-holds-them ()
  "Release magent: every session's snapshot and header equal magent's own."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let ((sessions (magent-store-magent-test--play)))
      (should (= (length sessions) 5))
      (magent-store-magent-test--check-sessions sessions)
      (should-not magent-store-magent--adapter-failures)
      (should-not magent-store-magent--unencodable))))

(ert-deftest magent-store-magent-sessions-under-schema-7-magent ()
  "Schema-7 magent (its header builder, its fork): the same holds."
  (skip-unless (magent-store-magent-test--use-magent 7))
  (unwind-protect
      (magent-store-magent-test--with-store
        (let ((sessions (magent-store-magent-test--play)))
          (should (= (length sessions) 5))
          (magent-store-magent-test--check-sessions sessions)
          (should-not magent-store-magent--adapter-failures)))
    (magent-store-magent-test--use-magent 6)))

;;;; 4: the schema-7 reader reads every session back as magent holds it

(defun magent-store-magent-test--content-event-valid (orig alist)
  "Validate ALIST as ORIG does, and `item-content-appended' as SPEC says."
  (let ((type (cdr (assq 'type alist))))
    (if (not (member type '("item-content-appended" item-content-appended)))
        (funcall orig alist)
      (let ((payload (cdr (assq 'payload alist))))
        (dolist (key '(turn-id item-id))
          (unless (and (stringp (cdr (assq key alist)))
                       (not (string-empty-p (cdr (assq key alist)))))
            (error "Invalid journal event %s: %s is required" type key)))
        (unless (and (listp payload)
                     (equal (sort (mapcar #'car payload) #'string<)
                            '(chunk output)))
          (error "Invalid %s payload: %S" type payload))
        (unless (and (stringp (cdr (assq 'chunk payload)))
                     (not (string-empty-p (cdr (assq 'chunk payload)))))
          (error "Invalid %s chunk" type))
        (unless (memq (cdr (assq 'output payload)) '(t :json-false))
          (error "Invalid %s output" type))
        alist))))

(defun magent-store-magent-test--content-event-apply (orig thread event)
  "Apply EVENT to THREAD as ORIG does, and `item-content-appended' as SPEC says."
  (if (not (eq (magent-thread-event-type event) 'item-content-appended))
      (funcall orig thread event)
    (let* ((payload (magent-thread-event-payload event))
           (now (magent-thread-event-created-at event))
           (output-p (eq (cdr (assq 'output payload)) t))
           (chunk (cdr (assq 'chunk payload))))
      (when-let ((item (magent-thread--find-item
                        thread (magent-thread-event-item-id event))))
        (if output-p
            (setf (magent-thread-item-output item)
                  (concat (or (magent-thread-item-output item) "") chunk))
          (setf (magent-thread-item-content item)
                (concat (or (magent-thread-item-content item) "") chunk)))
        (setf (magent-thread-item-updated-at item) now
              (magent-thread-updated-at thread) now))
      thread)))

(defmacro magent-store-magent-test--with-content-event (&rest body)
  "Run BODY with the release's ledger standing in for `item-content-appended'.
See the Commentary: upstream's ledger with that event is not public."
  (declare (indent 0) (debug t))
  `(let ((magent-journal-event-types
          (cons 'item-content-appended magent-journal-event-types)))
     (advice-add 'magent-thread--validate-event-alist :around
                 #'magent-store-magent-test--content-event-valid)
     (advice-add 'magent-thread-apply-event :around
                 #'magent-store-magent-test--content-event-apply)
     (unwind-protect (progn ,@body)
       (advice-remove 'magent-thread--validate-event-alist
                      #'magent-store-magent-test--content-event-valid)
       (advice-remove 'magent-thread-apply-event
                      #'magent-store-magent-test--content-event-apply))))

(defun magent-store-magent-test--read-back (sessions)
  "Read SESSIONS back with magent's schema-7 reader; check them whole."
  (let ((schema (if (fboundp 'magent-session--read-validated-data) 7 6)))
    (unwind-protect
        (progn
          (magent-store-magent-test--use-magent 7)
          (magent-store-magent-test--with-content-event
            (pcase-dolist (`(,session . ,scope) sessions)
              (ert-info ((format "schema-7 reader, session %s"
                                 (magent-session-get-id session)))
                (magent-store-flush (magent-session-get-id session))
                (let* ((file (magent-store-magent-test--header-file
                              session scope))
                       (read (magent-session--read-validated-data file))
                       (state (plist-get read :state))
                       (thread (magent-thread-replay (plist-get state :snapshot)
                                                     (plist-get state :events))))
                  (should (equal (plist-get read :id)
                                 (magent-session-get-id session)))
                  ;; Some events came after the snapshot: the log is read too.
                  (should (plist-get state :events))
                  (magent-store-magent-test--should-equal
                   (magent-store-magent-test--without
                    (magent-store-magent-test--parse
                     (magent-json-encode (magent-thread-snapshot-to-alist thread)))
                    'snapshot-created-at 'last-event-seq)
                   (magent-store-magent-test--magent-snapshot session))
                  (should (equal (mapcar #'magent-agent-job-to-alist
                                         (plist-get state :agent-jobs))
                                 (mapcar (lambda (job)
                                           (magent-store-magent-test--job
                                            job))
                                         (magent-session-agent-jobs session))))
                  (should (equal (plist-get state :approval-overrides)
                                 (magent-session-approval-overrides
                                  session))))))))
      (magent-store-magent-test--use-magent schema))))

(defun magent-store-magent-test--job (job)
  "JOB as it reads back from JSON: `magent-agent-job-to-alist' of the parse."
  (magent-agent-job-to-alist
   (magent-agent-job-from-alist
    (json-parse-string (magent-json-encode (magent-agent-job-to-alist job))
                       :object-type 'alist :array-type 'array
                       :null-object nil :false-object :json-false))))

(ert-deftest magent-store-magent-schema-7-reader-reads-every-session-back ()
  "Every session written passes the schema-7 reader and reads back whole."
  (skip-unless magent-store-test-upstream-session7)
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let ((magent-store-log-max-events 40))
      (magent-store-magent-test--read-back (magent-store-magent-test--play))
      (should-not magent-store-magent--adapter-failures))))

;;;; 3: never an error into magent, whatever magent holds

(cl-defstruct (magent-store-magent-test--record (:copier nil)) a b)

(defun magent-store-magent-test--shapes ()
  "Every JSON shape magent can hold, each one a tool input."
  (let ((table (make-hash-table :test #'equal)))
    (puthash "k" [1 :json-false :null] table)
    (puthash "empty" (make-hash-table :test #'equal) table)
    (list
     nil t :json-false :null 0 -1 most-positive-fixnum 1.5 -0.0 1e300 ""
     "plain" "quote \" backslash \\ tab \t end" "é😀\u2028\u200f"
     'a-symbol :a-keyword [] [nil t :json-false :null] (vector "a" [1 [2]])
     '(:a 1 :b nil :c :json-false :d :null :e [] :f (:g "h"))
     '((a . 1) (b) (c . :json-false) (d . [1 2]) (e . ((f . "g"))))
     '(("string-key" . 1) ("other" . "v"))
     '(1 "two" three :four nil)
     table
     (list :records (make-magent-store-magent-test--record :a 1 :b "x")
           :buffer (get-buffer-create " *magent-store-shape*")
           :function #'car))))

(defun magent-store-magent-test--unencodable ()
  "Values JSON cannot hold, as magent may still hold them."
  (list 0.0e+NaN 1.0e+INF -1.0e+INF (expt 2 70) (- (expt 2 66))
        (concat "raw " (string (unibyte-char-to-multibyte #xff)) " byte")
        (string-to-unibyte "\377\376 not UTF-8")
        (encode-coding-string "unibyte ü UTF-8" 'utf-8)
        (string #xD800 ?x) "nul \0 end"
        (list :nested (list :nan 0.0e+NaN :ok "fine"))))

(ert-deftest magent-store-magent-never-signals-into-magent ()
  "Every shape magent holds is persisted; what JSON cannot hold is noted once."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((session (magent-store-magent-test--session "s-shapes" 'global))
           (thread (magent-session-thread-ledger session))
           (turn-id (magent-thread-turn-id
                     (magent-thread-create-turn thread "shapes")))
           (shapes (magent-store-magent-test--shapes))
           (bad (magent-store-magent-test--unencodable))
           (messages-before (with-current-buffer (messages-buffer)
                              (buffer-string)))
           (n 0))
      ;; magent's own calls: none of them may signal.
      (dolist (value (append shapes bad))
        (let ((item (magent-thread-start-item
                     thread turn-id 'tool :id (format "call-%d" (cl-incf n))
                     :name "shape" :input value :metadata value)))
          (magent-thread-append-item-content thread item "out" t)
          (magent-thread-complete-item thread item :output value)
          (magent-session-save-deferred-for-session session 'global)))
      (magent-thread-complete-turn thread turn-id (car bad))
      (magent-session-save-for-session session 'global)
      (should-not magent-store-magent--adapter-failures)
      ;; Every encodable shape is stored exactly as magent's writer has it.
      (let* ((store (magent-store-magent-test--store-snapshot session 'global))
             (store-items (alist-get 'items (aref (alist-get 'turns store) 0)))
             (magent-items (magent-thread-turn-items
                            (car (magent-thread-turns thread)))))
        (should (= (length store-items) (+ (length shapes) (length bad))))
        (dotimes (i (length shapes))
          (ert-info ((format "shape %S" (nth i shapes)))
            (let ((magent (magent-store-magent-test--parse
                           (magent-json-encode (magent-thread-item-to-alist
                                                (nth i magent-items))))))
              ;; Completing with null or {} as output keeps the streamed
              ;; one (the ledger's merge rule: both are absent, and read
              ;; back as nil); [] is a value, kept as magent holds it.
              (when (member (magent-json-encode (nth i shapes))
                            '("null" "{}"))
                (setf (alist-get 'output magent) "out"))
              (magent-store-magent-test--should-equal (aref store-items i)
                                                      magent))))
        ;; What JSON cannot hold is stored in its most faithful form.
        (let ((stored (mapcar (lambda (i)
                                (alist-get 'input (aref store-items i)))
                              (number-sequence (length shapes)
                                               (1- (length store-items))))))
          ;; Integers beyond 64 bits and NUL are JSON: kept exactly where
          ;; this Emacs reads them back (30), else stored as text (28).
          (should (equal (butlast stored 1)
                         (list "0.0e+NaN" "1.0e+INF" "-1.0e+INF"
                               (if magent-store-magent--reader-refuses-bignum
                                   (number-to-string (expt 2 70))
                                 (expt 2 70))
                               (if magent-store-magent--reader-refuses-bignum
                                   (number-to-string (- (expt 2 66)))
                                 (- (expt 2 66)))
                               "raw \ufffd byte" "\ufffd\ufffd not UTF-8"
                               "unibyte ü UTF-8" "\ufffdx"
                               (if magent-store-magent--reader-refuses-nul
                                   "nul \ufffd end"
                                 "nul \0 end"))))
          (should (equal (car (last stored))
                         '((nested . ((nan . "0.0e+NaN") (ok . "fine"))))))))
      ;; Noted once each, and shown by `magent-store-status'.
      (should (= (length magent-store-magent--unencodable)
                 (if magent-store-magent--reader-refuses-nul 4 2)))
      (let ((said (with-current-buffer (messages-buffer)
                    (substring (buffer-string) (length messages-before)))))
        (should (= (cl-count-if (lambda (line)
                                  (string-match-p "cannot be written as JSON"
                                                  line))
                                (split-string said "\n"))
                   (length magent-store-magent--unencodable))))
      (magent-store-status)
      (with-current-buffer "*magent-store-status*"
        (should (string-match-p "Not JSON: +a NaN or infinite number, [0-9]+ times"
                                (buffer-string)))))))

;;;; A session magent clears starts afresh in the store too

(ert-deftest magent-store-magent-a-cleared-session-starts-afresh ()
  "magent clears a session: the store's files go; its next turn is alone."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((root (magent-store-magent-test--project "cleared"))
           (session (magent-store-magent-test--session "s-clear" root))
           (file (lambda (ext)
                   (concat (file-name-sans-extension
                            (magent-store-magent-test--header-file session root))
                           ext))))
      (magent-store-magent-test--turn session root "Before" 'completed)
      (magent-session-save-for-session session root)
      (should (file-exists-p (funcall file ".snapshot")))
      (let ((magent-session--current-scope root))
        (magent-session-clear session root))
      (dolist (ext '(".json" ".jsonl" ".snapshot" ".lock"))
        (should-not (file-exists-p (funcall file ext))))
      ;; magent makes the cleared session's new thread in its scope.
      (let ((magent-session--current-scope root))
        (magent-session-thread-ledger session))
      (magent-store-magent-test--turn session root "After" 'completed)
      (magent-session-save-for-session session root)
      (let ((store (magent-store-magent-test--store-snapshot session root)))
        (should (= (length (alist-get 'turns store)) 1))
        (magent-store-magent-test--should-equal
         store (magent-store-magent-test--magent-snapshot session)))
      (magent-store-magent-test--should-equal
       (magent-store-magent-test--store-header session root)
       (magent-store-magent-test--magent-header session root))
      (should-not magent-store-magent--adapter-failures))))

;; The header magent builds after the clear may be the very text sent
;; before it (the same title given again): the store, which removed the
;; old header with the files, must be sent it again, or the session is
;; listed without its title.
(ert-deftest magent-store-magent-a-cleared-session-has-its-header-sent-again ()
  "After a clear, the same header as before is sent again: the session keeps its title."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((root (magent-store-magent-test--project "recleared"))
           (session (magent-store-magent-test--session "s-reclear" root))
           (titled (lambda ()
                     (setf (magent-session-metadata session)
                           (list (cons 'title "Réglages du déploiement"))))))
      (funcall titled)
      (magent-store-magent-test--turn session root "Same first words" 'completed)
      (magent-session-save-for-session session root)
      (should (equal (alist-get 'title (magent-store-magent-test--store-header
                                        session root))
                     "Réglages du déploiement"))
      (let ((magent-session--current-scope root))
        (magent-session-clear session root)
        (magent-session-thread-ledger session))
      (funcall titled)
      (magent-store-magent-test--turn session root "Same first words" 'completed)
      (magent-session-save-for-session session root)
      (let ((after (magent-store-magent-test--store-header session root)))
        (should (equal (alist-get 'title after) "Réglages du déploiement"))
        (magent-store-magent-test--should-equal
         after (magent-store-magent-test--magent-header session root)))
      (should-not magent-store-magent--adapter-failures))))

;;;; A session the store already has is not sent again

(ert-deftest magent-store-magent-a-known-session-is-opened-without-its-state ()
  "After a restart, a session with a snapshot on disk opens without its
thread's state (Emacs would pay for encoding it), and stays exact."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let* ((action (magent-store-magent-test--action
                    "s-again" " my action/ünï " 'global))
           (session (car action))
           (scope (cdr action)))
      (magent-store-magent-test--turn session scope "One" 'completed)
      (magent-session-save-for-session session scope)
      (should (magent-store--session-initial
               (gethash "s-again" magent-store--sessions)))
      (magent-store-stop)
      (magent-store-magent-test--turn session scope "Two" 'completed)
      (should-not (magent-store--session-initial
                   (gethash "s-again" magent-store--sessions)))
      (magent-store-magent-test--should-equal
       (magent-store-magent-test--store-snapshot session scope)
       (magent-store-magent-test--magent-snapshot session))
      ;; A chunk first, after a restart: it reaches the store too.
      (let* ((thread (magent-session-thread-ledger session))
             (turn-id (magent-thread-turn-id
                       (magent-thread-create-turn thread "Three")))
             (item (magent-thread-start-item thread turn-id 'message
                                             :role 'assistant)))
        (magent-session-save-for-session session scope)
        (magent-store-stop)
        (magent-thread-append-item-content thread item "first after restart")
        (magent-store-magent-test--should-equal
         (magent-store-magent-test--store-snapshot session scope)
         (magent-store-magent-test--magent-snapshot session))))))

;;;; A session magent would not write is not written

(ert-deftest magent-store-magent-an-empty-session-is-not-written ()
  "magent writes a session once it has a turn or a job; so does the store."
  (magent-store-magent-test--use-magent 6)
  (magent-store-magent-test--with-store
    (let ((session (magent-store-magent-test--session "s-empty" 'global)))
      (magent-session-save-deferred-for-session session 'global)
      (magent-session-save-for-session session 'global)
      (sleep-for (* 2 magent-store-flush-interval))
      (should-not (file-exists-p (magent-store-magent-test--header-file
                                  session 'global)))
      (magent-store-magent-test--turn session 'global "Now" 'completed)
      (magent-store-magent-test--should-equal
       (magent-store-magent-test--store-header session 'global)
       (magent-store-magent-test--magent-header session 'global)))))

;;;; 5: with the mode off, magent is untouched

(defun magent-store-magent-test--own-save (session)
  "SESSION as magent's own save writes it (global), without volatile fields."
  (let ((file (magent-session-save-for-session session 'global)))
    (with-temp-buffer
      (insert-file-contents file)
      (let ((data (magent-store-magent-test--parse (buffer-string))))
        (setf (alist-get 'snapshot data)
              (magent-store-magent-test--without (alist-get 'snapshot data)
                                                 'snapshot-created-at))
        data))))

(ert-deftest magent-store-magent-mode-off-leaves-magent-untouched ()
  "Off, magent saves by itself, as before the mode was ever on; no advice
is put on a function magent lacks, and the mode says so once."
  (magent-store-magent-test--use-magent 6)
  (should-not (fboundp 'magent-session-load))
  (should-not (assq 'magent-session-load magent-store-magent-functions))
  (let* ((tmp (make-temp-file "magent-store-off-" t))
         (magent-session-directory tmp)
         (session (magent-store-magent-test--session "s-off" 'global))
         before)
    (unwind-protect
        (progn
          (magent-store-magent-test--turn session 'global "Hi" 'completed)
          (setq before (magent-store-magent-test--own-save session))
          (magent-store-mode 1)
          (magent-store-mode -1)
          (dolist (row magent-store-magent-functions)
            (when (keywordp (nth 1 row))
              (should-not (advice-member-p (nth 2 row) (nth 0 row)))))
          (should (equal (magent-store-magent-test--own-save session) before))
          (should (= (hash-table-count magent-store--sessions) 0))
          ;; A magent without `magent-session-read-file': not advised, and
          ;; shown by the status, not said at every start.
          (let ((definition (symbol-function 'magent-session-read-file))
                (magent-store-magent--reported 'never)
                (messages-before (with-current-buffer (messages-buffer)
                                   (buffer-string))))
            (fmakunbound 'magent-session-read-file)
            (unwind-protect
                (progn
                  (dotimes (_ 2)
                    (magent-store-mode 1)
                    (should-not (fboundp 'magent-session-read-file))
                    (should (advice-member-p
                             #'magent-store-magent--after-append-item-content
                             'magent-thread-append-item-content))
                    (should (string-match-p
                             "^ +not done: a session is flushed, then read by magent"
                             (magent-store-magent--adapter-status)))
                    (magent-store-mode -1))
                  (should-not (string-match-p
                               "magent-store-mode: .*magent"
                               (with-current-buffer (messages-buffer)
                                 (substring (buffer-string)
                                            (length messages-before))))))
              (fset 'magent-session-read-file definition))))
      (magent-store-mode -1)
      (delete-directory tmp t))))

;; What the mode only calls is never advised by it: turning it off must
;; leave whatever else advises those functions in place.
(ert-deftest magent-store-magent-mode-off-keeps-others-advice ()
  "Advice put by someone else on magent functions, those the mode advises
and those it only calls, is still there once the mode is turned off."
  (magent-store-magent-test--use-magent 6)
  (let ((advice (lambda (orig &rest args) (apply orig args)))
        (functions '(magent-thread-session-id magent-session-metadata
                     magent-thread-append-event)))
    (unwind-protect
        (progn
          (dolist (function functions)
            (advice-add function :around advice))
          (magent-store-mode 1)
          (magent-store-mode -1)
          (dolist (function functions)
            (ert-info ((format "%s" function))
              (should (advice-member-p advice function)))))
      (magent-store-mode -1)
      (dolist (function functions)
        (advice-remove function advice)))))

(ert-deftest magent-store-magent-what-the-mode-needs-is-said-once-per-set-of-gaps ()
  "A magent lacking what the mode needs: the mode says so once, and again
only when what is lacking changes; a magent with all of it says nothing."
  (magent-store-magent-test--use-magent 6)
  (let* ((messages nil)
         (magent-store-magent--reported 'never)
         (magent-store-magent--missing nil)
         (lacking '(magent-session-agent-jobs magent-session-approval-overrides))
         (definitions (mapcar (lambda (name) (cons name (symbol-function name)))
                              lacking))
         (toggle (lambda ()
                   (magent-store-mode 1)
                   (magent-store-mode -1)))
         (said (lambda ()
                 (prog1 (cl-remove-if-not
                         (lambda (text)
                           (string-match-p "missing what the mode needs" text))
                         messages)
                   (setq messages nil)))))
    (cl-letf (((symbol-function 'message)
               (lambda (format &rest args)
                 (when format (push (apply #'format-message format args) messages)))))
      (unwind-protect
          (progn
            (fmakunbound 'magent-session-approval-overrides)
            (dotimes (_ 2) (funcall toggle))
            (let ((once (funcall said)))
              (should (= (length once) 1))
              (should (string-match-p
                       "needs for: the header's approval-overrides; that is left"
                       (car once))))
            (fmakunbound 'magent-session-agent-jobs)
            (dotimes (_ 2) (funcall toggle))
            (let ((once (funcall said)))
              (should (= (length once) 1))
              (should (string-match-p
                       "needs for: the header's agent-jobs; the header's approval-overrides; that"
                       (car once))))
            (pcase-dolist (`(,name . ,definition) definitions)
              (fset name definition))
            (dotimes (_ 2) (funcall toggle))
            (should-not (funcall said))
            (fmakunbound 'magent-session-approval-overrides)
            (funcall toggle)
            (should (= (length (funcall said)) 1)))
        (pcase-dolist (`(,name . ,definition) definitions)
          (fset name definition))
        (magent-store-mode -1)))))

(ert-deftest magent-store-magent-mode-on-before-magent-routes-once-magent-loads ()
  "Turned on before magent is loaded, the mode waits: other files loading
change nothing; once magent's session module loads, its functions are
advised and the mode stops waiting."
  (magent-store-magent-test--use-magent 6)
  (let* ((row (cl-find-if (lambda (row) (and (keywordp (nth 1 row))
                                             (not (eq (nth 3 row) 'when-used))
                                             (fboundp (nth 0 row))))
                          magent-store-magent-functions))
         (advised (lambda () (advice-member-p (nth 2 row) (nth 0 row))))
         (loaded t)
         (magent-store-magent--missing nil)
         (magent-store-magent--reported 'never))
    (unwind-protect
        (cl-letf (((symbol-function 'featurep)
                   (let ((featurep (symbol-function 'featurep)))
                     (lambda (feature &rest rest)
                       (and (or loaded (not (eq feature 'magent-session)))
                            (apply featurep feature rest))))))
          ;; As before magent is loaded: its module missing, nothing of it advised.
          (setq loaded nil)
          (magent-store-mode 1)
          (magent-store-magent--uninstall)
          (should (memq #'magent-store-magent--loaded after-load-functions))
          (run-hook-with-args 'after-load-functions "/elsewhere/other.el")
          (should (memq #'magent-store-magent--loaded after-load-functions))
          (should-not (funcall advised))
          ;; magent's session module loads.
          (setq loaded t)
          (run-hook-with-args 'after-load-functions "/elsewhere/magent-session.el")
          (should (funcall advised))
          (should-not (memq #'magent-store-magent--loaded after-load-functions)))
      (magent-store-mode -1))))

(ert-deftest magent-store-magent-the-current-release-is-described-not-complained-about ()
  "With magent's current release the mode says nothing at start (every
start, also before magent is loaded); the status says, in user words,
what the mode makes of it, naming none of magent's private functions."
  (magent-store-magent-test--use-magent 6)
  (let ((messages nil)
        (magent-store-magent--reported 'never))
    (cl-letf (((symbol-function 'message)
               (lambda (format &rest args)
                 (when format (push (apply #'format-message format args) messages)))))
      (unwind-protect
          (progn
            (dotimes (_ 2)
              (magent-store-mode 1)
              (magent-store-mode -1))
            ;; As if magent were not loaded yet: the mode waits for it.
            (cl-letf (((symbol-function 'featurep)
                       (let ((featurep (symbol-function 'featurep)))
                         (lambda (feature &rest rest)
                           (and (not (eq feature 'magent-session))
                                (apply featurep feature rest))))))
              (let ((magent-store-magent--missing nil))
                (magent-store-mode 1)
                (should (string-match-p "^Magent: +not loaded yet"
                                        (magent-store-magent--adapter-status)))
                (magent-store-mode -1)))
            (magent-store-mode 1)
            (let ((status (magent-store-magent--adapter-status)))
              (should (string-match-p
                       "^Magent: +magent's current release (sessions in schema 6.*;\n +headers are built by magent-store, as magent builds them$"
                       status))
              (should-not (string-match-p "--" status))))
        (magent-store-mode -1)))
    (should-not (cl-find-if (lambda (text) (string-match-p "magent-store-mode:" text))
                            messages))))

(provide 'magent-store-magent-tests)
;;; magent-store-magent-tests.el ends here
