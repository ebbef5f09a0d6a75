;;; magent-store-test-timing-standin.el --- A stand-in magent that emits lifecycle events  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; magent is not needed to test the timing sink: this file stands in for
;; it with functions of magent's names and signatures, and lifecycle
;; event plists of the documented shapes (magent-lifecycle-events.el:
;; :type :time :context :turn-id :subagent-id, then each event's own
;; keys: :title, :prompt-count, :call-id, :tool-name, :args, :result,
;; :status, :detail ...).
;;
;; `magent-store-test-timing-standin-run' plays four turns with injected times
;; (so the report's figures are known exactly) while streaming chunks
;; into a session through `magent-store-mode's advice, and plants a
;; secret string everywhere magent could leak one: chunks, tool
;; arguments and results, titles, error details, item metadata, model
;; names, and timing props that are not allowed.  Used by the ERT tests
;; and, through `magent-store-test-timing-standin-batch', by tests/test_report.py.

;;; Code:

(require 'cl-lib)

(require 'magent-store-test-backend)
(require 'magent-store)
(require 'magent-store-timing)

;;;; magent-lifecycle-events, as magent has it

(unless (fboundp 'magent-lifecycle-events-context-create)
  (cl-defstruct (magent-lifecycle-events-context
                 (:constructor magent-lifecycle-events-context-create)
                 (:copier nil))
    turn-id subagent-id title ended))

(defvar magent-lifecycle-events--sinks nil
  "Registered sinks, as in magent.")

(unless (fboundp 'magent-lifecycle-events-add-sink)
  (defun magent-lifecycle-events-add-sink (sink)
    (cl-pushnew sink magent-lifecycle-events--sinks :test #'eq)
    sink)
  (defun magent-lifecycle-events-remove-sink (sink)
    (setq magent-lifecycle-events--sinks
          (delq sink magent-lifecycle-events--sinks))))

(defun magent-store-test-timing-standin-emit (type time context &rest props)
  "Emit lifecycle event TYPE at TIME in CONTEXT with PROPS, as magent does."
  (let ((event (append (list :type type :time time)
                       (when context
                         (list :context context
                               :turn-id (magent-lifecycle-events-context-turn-id
                                         context)
                               :subagent-id
                               (magent-lifecycle-events-context-subagent-id
                                context)))
                       props)))
    (dolist (sink magent-lifecycle-events--sinks)
      (funcall sink event))))

;;;; magent's ledger and session functions (the ones the mode advises)

(unless (fboundp 'magent-thread-session-id)
  (defun magent-thread-session-id (thread) (plist-get thread :session-id))
  (defun magent-thread-scope (thread) (plist-get thread :scope))
  (defun magent-thread-item-id (item) (plist-get item :id))
  (defun magent-thread-event-to-alist (event) event)
  (defun magent-session-get-id (session) (plist-get session :id))
  (defun magent-session-thread-ledger (session) (plist-get session :thread))
  (defun magent-thread-append-event (_thread event) event)
  (defun magent-thread-append-item-content (_thread _item _chunk &optional _output-p)
    nil)
  (defun magent-session-save-deferred-for-session (_session &optional _scope _delay)
    nil)
  (defun magent-session-save-for-session (_session _scope) nil))

;;;; The turns

(defconst magent-store-test-timing-standin-secrets
  '("sekrit-chunk-4f1c" "sekrit-tool-arg-9a2e" "sekrit-file-name-77d0"
    "sekrit-tool-output-1b3b" "sekrit-error-detail-c0de" "sekrit-metadata-5e5e"
    "sekrit-prompt-title-0a0a" "sekrit-model-name-e1e1" "sekrit-prop-d00d"
    "sekrit-turn-id-f00f")
  "Strings planted where magent could leak content; none may reach the state dir.")

(defun magent-store-test-timing-standin--secret (n)
  "Return the Nth planted secret."
  (nth n magent-store-test-timing-standin-secrets))

(defun magent-store-test-timing-standin--event (type &rest fields)
  "Return a journal event alist of TYPE with FIELDS (a plist)."
  `((seq) (type . ,type) (thread-id . "thread-1")
    (turn-id . ,(plist-get fields :turn-id))
    (item-id . ,(plist-get fields :item-id))
    (payload . ,(plist-get fields :payload))
    (created-at . ,(float-time))))

(defun magent-store-test-timing-standin--journal-turn (thread turn-id)
  "Journal TURN-ID in THREAD with an assistant item carrying secret metadata."
  (let ((now (float-time))
        (item-id (concat turn-id "-a")))
    (magent-thread-append-event
     thread (magent-store-test-timing-standin--event
             "turn-started" :turn-id turn-id
             :payload `((turn . ((id . ,turn-id) (thread-id . "thread-1")
                                 (status . "in-progress")
                                 (input . ,(magent-store-test-timing-standin--secret 6))
                                 (items . []) (queued-at . ,now)
                                 (started-at . ,now))))))
    (magent-thread-append-event
     thread (magent-store-test-timing-standin--event
             "item-started" :turn-id turn-id :item-id item-id
             :payload `((item . ((id . ,item-id) (turn-id . ,turn-id)
                                 (type . "message") (status . "in-progress")
                                 (role . "assistant")
                                 (metadata . ((note . ,(magent-store-test-timing-standin--secret 5))))
                                 (created-at . ,now) (updated-at . ,now))))))
    (list :id item-id)))

(defun magent-store-test-timing-standin--stream (thread item n)
  "Stream N chunks holding a secret into ITEM of THREAD, then save."
  (dotimes (i n)
    (magent-thread-append-item-content
     thread item (format "chunk %d %s\n" i (magent-store-test-timing-standin--secret 0)))
    (magent-session-save-deferred-for-session
     (list :id (plist-get thread :session-id) :thread thread))
    (sleep-for 0.005))
  ;; The save that ends a turn: its round trip lands inside the turn.
  (magent-store-flush (plist-get thread :session-id)))

(defun magent-store-test-timing-standin--fpe (turn-id time)
  "Record the first provider event of TURN-ID at TIME, as magent's loop would."
  (magent-store-record-timing 'first-provider-event :turn-id turn-id :time time
                              :error (magent-store-test-timing-standin--secret 8)))

(defun magent-store-test-timing-standin-run (session-id)
  "Play four turns into SESSION-ID with injected times; return the base time.
Turns, offsets in seconds from each turn's start:
- turn-ord: request at 0.01, first event 0.31, request end 1.01, end 1.02.
- turn-tool: request 0 (10 messages), first event 0.2; tool calls a
  0.5-1.5 and b 0.6-2.6 overlap; a subagent (0.7-1.3) requests at 0.75
  and runs tool c 0.9-1.2; request 2.9 (first event 3.0), an ACP update
  of 5 ms at 3.4, request end 3.5, end 3.6.
- turn-long: request 0 with 240 messages, first event 0.9, end 2.1.
- turn-ord2: request 0.01, first event 0.11, end 0.5."
  (let* ((thread (list :session-id session-id :scope 'global))
         (base (- (float-time) 100))
         (emit #'magent-store-test-timing-standin-emit)
         (secret #'magent-store-test-timing-standin--secret))
    (magent-thread-append-event
     thread (magent-store-test-timing-standin--event "thread-started"))
    ;; turn-ord
    (let* ((t0 base)
           (ctx (magent-lifecycle-events-context-create :turn-id "turn-ord"))
           (item (magent-store-test-timing-standin--journal-turn thread "turn-ord")))
      (funcall emit 'turn-start t0 ctx :title (funcall secret 6))
      (funcall emit 'llm-request-start (+ t0 0.01) ctx
               :backend "Standin" :model (funcall secret 7)
               :prompt-count 4 :tool-count 3 :system-prompt-length 1234)
      (magent-store-test-timing-standin--fpe "turn-ord" (+ t0 0.31))
      (magent-store-test-timing-standin--stream thread item 12)
      (funcall emit 'llm-request-end (+ t0 1.01) ctx :status 'completed
               :model (funcall secret 7))
      (funcall emit 'turn-end (+ t0 1.02) ctx :status 'completed :detail nil))
    ;; turn-tool, with overlapping tool calls and a subagent
    (let* ((t0 (+ base 2))
           (ctx (magent-lifecycle-events-context-create :turn-id "turn-tool"))
           (sub (magent-lifecycle-events-context-create
                 :turn-id "turn-tool" :subagent-id "subagent-standin-1"
                 :title (funcall secret 6)))
           (args (list :path (funcall secret 2) :command (funcall secret 1)))
           (item (magent-store-test-timing-standin--journal-turn thread "turn-tool")))
      (funcall emit 'turn-start t0 ctx :title "Fix it")
      (funcall emit 'llm-request-start t0 ctx :prompt-count 10 :tool-count 3)
      (magent-store-test-timing-standin--fpe "turn-tool" (+ t0 0.2))
      (magent-store-test-timing-standin--stream thread item 4)
      (dolist (call '(("call-a" 0.5 1.5) ("call-b" 0.6 2.6)))
        (funcall emit 'tool-call-start (+ t0 (nth 1 call)) ctx
                 :call-id (car call) :tool-name "bash" :title "bash"
                 :summary (funcall secret 1) :description (funcall secret 1)
                 :args args :ui-visible t))
      (funcall emit 'subagent-start (+ t0 0.7) sub :title (funcall secret 6))
      (funcall emit 'llm-request-start (+ t0 0.75) sub :prompt-count 2)
      (funcall emit 'tool-call-start (+ t0 0.9) sub :call-id "call-c"
               :tool-name "read_file" :args args)
      (funcall emit 'tool-call-end (+ t0 1.2) sub :call-id "call-c"
               :tool-name "read_file" :status 'completed
               :result (funcall secret 3) :result-summary (funcall secret 3))
      (funcall emit 'subagent-stop (+ t0 1.3) sub)
      (dolist (call '(("call-a" 1.5 completed) ("call-b" 2.6 failed)))
        (funcall emit 'tool-call-end (+ t0 (nth 1 call)) ctx
                 :call-id (car call) :tool-name "bash" :status (nth 2 call)
                 :exit-code 1 :result (funcall secret 3)
                 :result-summary (funcall secret 4)))
      (funcall emit 'llm-request-start (+ t0 2.9) ctx :prompt-count 14)
      (magent-store-test-timing-standin--fpe "turn-tool" (+ t0 3.0))
      (magent-store-record-timing 'acp-update :turn-id "turn-tool"
                                  :time (+ t0 3.4) :duration-ms 5 :count 1
                                  :title (funcall secret 8))
      (funcall emit 'llm-request-end (+ t0 3.5) ctx :status 'completed)
      (funcall emit 'turn-end (+ t0 3.6) ctx :status 'completed))
    ;; turn-long
    (let* ((t0 (+ base 6))
           (ctx (magent-lifecycle-events-context-create :turn-id "turn-long"))
           (item (magent-store-test-timing-standin--journal-turn thread "turn-long")))
      (funcall emit 'turn-start t0 ctx)
      (funcall emit 'llm-request-start t0 ctx :prompt-count 240)
      (magent-store-test-timing-standin--fpe "turn-long" (+ t0 0.9))
      (magent-store-test-timing-standin--stream thread item 4)
      (funcall emit 'llm-request-end (+ t0 2.0) ctx :status 'failed)
      (funcall emit 'turn-end (+ t0 2.1) ctx :status 'failed
               :detail (funcall secret 4)))
    ;; turn-ord2
    (let* ((t0 (+ base 9))
           (ctx (magent-lifecycle-events-context-create :turn-id "turn-ord2")))
      (funcall emit 'turn-start t0 ctx)
      (funcall emit 'llm-request-start (+ t0 0.01) ctx :prompt-count 6)
      (magent-store-test-timing-standin--fpe "turn-ord2" (+ t0 0.11))
      (funcall emit 'turn-end (+ t0 0.5) ctx :status 'completed))
    ;; What a careless caller might pass: dropped by the shim, and what
    ;; reaches the backend anyway is dropped there.
    (magent-store-record-timing 'acp-update :turn-id (funcall secret 9)
                                :time (+ base 20) :status (funcall secret 4))
    (magent-store-call
     "record-timings"
     (list (list (list 'acp-update nil 1 :error (funcall secret 4)
                       :duration-ms (funcall secret 8)
                       :status (intern (funcall secret 4)))
                 (list (intern (funcall secret 8)) "turn-ord" 1))))
    (magent-store-timing-flush)
    base))

(defun magent-store-test-timing-standin-batch ()
  "Run the turns under `emacs --batch' for tests/test_report.py.
The session root is $MAGENT_STORE_TEST_ROOT, the backend command
$MAGENT_STORE_TEST_PYTHON; the state directory is $XDG_STATE_HOME."
  (let ((magent-store-root (getenv "MAGENT_STORE_TEST_ROOT"))
        (magent-store-python (or (getenv "MAGENT_STORE_TEST_PYTHON")
                                 magent-store-python)))
    (magent-store-mode 1)
    (unwind-protect
        (princ (format "%s\n" (magent-store-test-timing-standin-run "s-timing")))
      (magent-store-mode -1)
      (magent-store-stop))))

(provide 'magent-store-test-timing-standin)
;;; magent-store-test-timing-standin.el ends here
