;;; magent-store-timing-tests.el --- ERT tests for magent-store-timing  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The timing sink through the real shim and backend, with the stand-in
;; magent of magent-store-test-timing-standin.el: records ride the flush
;; message, the mode registers and removes the sink and the advice, the
;; report command shows the stand-in's turns, no planted secret reaches
;; the state directory, and recording costs no more than a chunk.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test-timing-standin)
(require 'magent-store-test-alloc)
(require 'magent-store-test-backend)

;; magent's provider-event loop, as the advice sees it.
(unless (fboundp 'magent-agent-loop-apply-event)
  (defun magent-agent-loop-apply-event (loop _event) loop)
  (defun magent-agent-loop-event-context (loop) (plist-get loop :context))
  (defun magent-llm-event-type (event) (plist-get event :type)))

(defmacro magent-store-timing-test--with-backend (&rest body)
  "Run BODY with a private root, state dir and timing state; clean up after."
  (declare (indent 0) (debug t))
  `(magent-store-test-with-backend
       ((state (expand-file-name "state" tmp))
        (magent-store-timing--queue nil)
        (magent-store-timing--timer nil)
        (magent-store-timing--turn nil)
        (magent-store-timing--turn-start 0.0)
        (magent-store-timing--last-turn nil)
        (magent-store-timing--ordinals (make-hash-table :test #'equal))
        (magent-store-timing--next-ordinal 0)
        (magent-lifecycle-events--sinks nil))
     (unwind-protect
         (progn ,@body)
       (magent-store-mode -1)
       (when magent-store-timing--timer (cancel-timer magent-store-timing--timer)))))

(defun magent-store-timing-test--metrics (state)
  "Return the records in STATE's metrics file, parsed, oldest first."
  (let ((file (expand-file-name "magent-store/metrics.jsonl" state)))
    (when (file-exists-p file)
      (with-temp-buffer
        (insert-file-contents file)
        (let (records)
          (goto-char (point-min))
          (while (not (eobp))
            (push (json-parse-buffer :object-type 'alist) records)
            (skip-chars-forward "\n"))
          (nreverse records))))))

;;;; Tests

(ert-deftest magent-store-timing-a-record-keeps-only-what-is-allowed ()
  "A record keeps numbers of zero or more and a known status, as a known
word or as text; a negative number, an unknown status and any other
property are left out."
  (should (equal (magent-store-timing--props
                  '(:bytes 0 :count 3 :chunks -1 :status "failed" :prompt "secret"))
                 '(:status failed :count 3 :bytes 0)))
  (should (equal (magent-store-timing--props '(:status completed)) '(:status completed)))
  (should (equal (magent-store-timing--props '(:status "exploded" :items 2)) '(:items 2)))
  (should (equal (magent-store-timing--props '(:status exploded :items 2)) '(:items 2)))
  (should (equal (magent-store-timing--props '(:status nil)) nil)))

(ert-deftest magent-store-timing-mode-registers-and-removes-the-sink ()
  "The mode adds the sink and the provider-event advice, and removes both."
  (let ((magent-lifecycle-events--sinks nil))
    (unwind-protect
        (progn
          (magent-store-mode 1)
          (should (memq #'magent-store-timing--sink
                        magent-lifecycle-events--sinks))
          (should (advice-member-p #'magent-store-timing--before-apply-event
                                   'magent-agent-loop-apply-event))
          (magent-store-mode -1)
          (should-not magent-lifecycle-events--sinks)
          (should-not (advice-member-p #'magent-store-timing--before-apply-event
                                       'magent-agent-loop-apply-event)))
      (magent-store-mode -1))))

(ert-deftest magent-store-timing-provider-events-give-first-event-and-reasoning ()
  "The first normalized event of a request is recorded once; reasoning spans too."
  (let ((magent-lifecycle-events--sinks nil)
        (magent-store-timing--queue nil)
        (magent-store-timing--timer 'pending) ; no timer: nothing is sent
        (magent-store-timing--ordinals (make-hash-table :test #'equal))
        (magent-store-timing--next-ordinal 0)
        (ctx (magent-lifecycle-events-context-create
              :turn-id "turn-r" :subagent-id "sub-r")))
    (unwind-protect
        (progn
          (magent-store-mode 1)
          (magent-store-test-timing-standin-emit 'llm-request-start 100.0 ctx
                                            :prompt-count 3)
          (dolist (type '(reasoning-delta reasoning-delta text-delta text-delta))
            (magent-agent-loop-apply-event (list :context ctx)
                                           (list :type type :text "x")))
          (let ((records (reverse magent-store-timing--queue)))
            (should (equal (mapcar #'car records)
                           '(llm-request-start first-provider-event
                                               reasoning-start reasoning-end)))
            (should (equal (nth 1 (car records)) "turn-r"))
            (should (equal (nthcdr 3 (car records)) '(:messages 3 :agent 1)))
            (should (equal (nth 2 (car records)) 100000000))
            (dolist (record (cdr records))
              (should (equal (nth 1 record) "turn-r"))
              (should (equal (nthcdr 3 record) '(:agent 1))))))
      (magent-store-mode -1))))

(ert-deftest magent-store-timing-a-save-belongs-to-the-turn-it-was-sent-in ()
  "A flush's save is the turn's that was in progress when it was sent."
  (let ((magent-store-timing--queue nil)
        (magent-store-timing--timer 'pending)
        (magent-store-timing--turn "t2")
        (magent-store-timing--turn-start 200.0)
        (magent-store-timing--last-turn '("t1" 100.0 150.0))
        (reply '(3 3 100 2.5 nil)))
    (dolist (sent '(149.0 201.0 151.5 160.0 90.0))
      (magent-store-timing--flushed
       sent (list 1 (make-vector (* 2 magent-store-entry-slots) nil)
                  (* 2 magent-store-entry-slots))
       reply))
    (let ((records (reverse magent-store-timing--queue)))
      (should (equal (mapcar (lambda (r) (nth 1 r)) records) '("t1" "t2" "t1")))
      (should (equal (nth 2 (car records)) 149002500))
      (should (equal (plist-get (nthcdr 3 (car records)) :duration-ms) 2.5))
      (should (equal (plist-get (nthcdr 3 (car records)) :items) 2))
      (should (equal (plist-get (nthcdr 3 (car records)) :bytes) 100)))))

(defun magent-store-timing-test--start-events (session-id)
  "Journal a thread in SESSION-ID, enough to make it flush."
  (magent-store-append-event
   session-id `((seq) (type . "thread-started") (thread-id . "thread-1")
                (turn-id) (item-id) (payload) (created-at . ,(float-time)))))

(ert-deftest magent-store-timing-records-ride-the-flush-message ()
  "While a session flushes, records travel in its flush: no message of their own."
  (magent-store-timing-test--with-backend
    (let ((sent nil)
          (magent-store-timing-send-delay 1.0)
          (flushes '("flush" "tick"))
          (ctx (magent-lifecycle-events-context-create :turn-id "turn-f")))
      (advice-add 'magent-store-send :before
                  (lambda (method args &rest _) (push (cons method args) sent))
                  '((name . magent-store-timing-test)))
      (unwind-protect
          (progn
            (magent-store-mode 1)
            (magent-store-open "s-ride")
            (magent-store-test-timing-standin-emit 'turn-start (float-time) ctx)
            (magent-store-test-timing-standin-emit 'tool-call-start (float-time) ctx
                                              :call-id "c1" :args '(:path "/x"))
            (magent-store-timing-test--start-events "s-ride")
            (sleep-for (* 2 magent-store-flush-interval))
            ;; The first message after the records is the flush, carrying them.
            (let ((flush (car (cl-member-if
                               (lambda (m) (member (car m) (cons "record-timings"
                                                                 flushes)))
                               (reverse sent)))))
              (should (member (car flush) flushes))
              (should (equal (mapcar #'car (nth 2 (cdr flush)))
                             '(turn-start tool-call-start))))
            ;; With no flush coming, a record goes alone after the delay.
            (setq sent nil
                  magent-store-timing-send-delay 0.1)
            (sleep-for 1.2) ; the save of that flush goes alone too
            (setq sent nil)
            (magent-store-record-timing 'acp-update :duration-ms 2 :count 1)
            (sleep-for (+ magent-store-timing-send-delay 0.2))
            (should sent)
            (should (cl-every (lambda (m) (equal (car m) "record-timings")) sent)))
        (advice-remove 'magent-store-send 'magent-store-timing-test))
      (magent-store-timing-flush)
      (let ((types (mapcar (lambda (r) (alist-get 'type r))
                           (magent-store-timing-test--metrics state))))
        ;; The save is recorded when the tick's reply comes, which the
        ;; backend may hold back a while: its place is not fixed.
        (should (equal (seq-take types 2) '("turn-start" "tool-call-start")))
        (should (equal (sort (seq-drop types 2) #'string<)
                       '("acp-update" "session-save")))))))

(ert-deftest magent-store-timing-report-command-shows-the-standin-turns ()
  "`magent-store-timing-report' shows the CLI's report in a read-only buffer."
  (magent-store-timing-test--with-backend
    (magent-store-mode 1)
    (magent-store-test-timing-standin-run "s-report")
    (let ((buffer (magent-store-timing-report)))
      (with-current-buffer buffer
        (should buffer-read-only)
        (goto-char (point-min))
        (should (search-forward "ordinary: 2 turns" nil t))
        (should (search-forward "tool-use: 1 turns" nil t))
        (should (search-forward "long-history: 1 turns" nil t))
        (should (search-forward "3.600s" nil t)))
      (kill-buffer buffer))))

(ert-deftest magent-store-timing-no-secret-reaches-the-state-directory ()
  "Secrets in chunks, tool args, errors and metadata stay out of metrics and logs."
  (magent-store-timing-test--with-backend
    (magent-store-mode 1)
    (magent-store-test-timing-standin-run "s-secret")
    (magent-store-stop)
    ;; What this machine keeps of the sessions themselves (their search index holds
    ;; their text, as they do) is under roots/: the rest is metrics and logs.
    (let ((files (cl-remove-if (lambda (file)
                                 (string-prefix-p (expand-file-name "magent-store/roots/" state) file))
                               (directory-files-recursively state ""))))
      (should (member (expand-file-name "magent-store/metrics.jsonl" state) files))
      (should (member (expand-file-name "magent-store/server.log" state) files))
      (dolist (file files)
        (with-temp-buffer
          (insert-file-contents-literally file)
          (dolist (secret magent-store-test-timing-standin-secrets)
            (goto-char (point-min))
            (should-not (search-forward secret nil t))))))
    ;; Planted for real: the session holds them.
    (with-temp-buffer
      (insert-file-contents-literally
       (expand-file-name "global/s-secret.jsonl" magent-store-root))
      (should (search-forward (car magent-store-test-timing-standin-secrets) nil t)))))

(defun magent-store-timing-test--per-call-us (n function)
  "Return the microseconds per call of FUNCTION, best of 5 runs of N calls."
  (let (best)
    (dotimes (_ 5)
      (garbage-collect)
      (let ((start (float-time)))
        (dotimes (_ n) (funcall function))
        (let ((us (/ (* 1e6 (- (float-time) start)) n)))
          (setq best (if best (min best us) us)))))
    best))

;; Timing belongs to the benchmark (magent-store-test-timing-cost.el prints the
;; microseconds); what a test can pin without a clock is allocation, which
;; is what turns into garbage-collection pauses in a user's Emacs.
(ert-deftest magent-store-timing-recording-allocates-one-small-record ()
  "A lifecycle event or a `magent-store-record-timing' call allocates one
small queued record (a short list of numbers and symbols), never a copy
of what magent passed in, and printing records into the flush message
allocates no copy of a record."
  (magent-store-timing-test--with-backend
    (let* ((ctx (magent-lifecycle-events-context-create :turn-id "turn-c"))
           (start (list :type 'tool-call-start :time 1.0 :context ctx
                        :turn-id "turn-c" :subagent-id nil :call-id "c1"
                        :tool-name "bash" :args '(:command "ls")))
           (end (list :type 'tool-call-end :time 2.0 :context ctx
                      :turn-id "turn-c" :subagent-id nil :call-id "c1"
                      :tool-name "bash" :status 'completed
                      :result (make-string 100000 ?x)))
           (n 200)
           sink record)
      (magent-store-open "s-cost")
      (magent-store-test-alloc--compile)
      ;; Warm up: the first calls may create the queue or intern names.
      (magent-store-timing--sink start)
      (magent-store-record-timing 'acp-update :duration-ms 1.5 :count 1)
      (setq magent-store-timing--queue nil)
      (setq sink (/ (magent-store-test-alloc--bytes
                     (magent-store-test-alloc--counting
                       (dotimes (_ (/ n 2))
                         (magent-store-timing--sink start)
                         (magent-store-timing--sink end))))
                    (float n)))
      (setq magent-store-timing--queue nil)
      (setq record (/ (magent-store-test-alloc--bytes
                       (magent-store-test-alloc--counting
                         (dotimes (_ n)
                           (magent-store-record-timing
                            'acp-update :duration-ms 1.5 :count 1))))
                      (float n)))
      (let* ((records (make-list 10 (list 'tool-call-start "turn-c"
                                          1764400000000000 :call 3 :agent 1)))
             (printing (magent-store-test-alloc--bytes
                        (magent-store-test-alloc--counting
                          (dotimes (_ 20)
                            (magent-store--with-send-buffer
                              (magent-store-print
                               (list 'call 1 'tick (list "s" records)))))))))
        (setq magent-store-timing--queue nil)
        (message "bytes allocated: lifecycle event %.0f, record-timing %.0f, \
printing 200 records %d" sink record printing)
        ;; A record is a list of at most a dozen cells and one float: a
        ;; copy of the 100,000-character result would be 100,000 bytes.
        (should (< sink 400))
        (should (< record 400))
        (should (< printing (* 200 64)))))))

(defmacro magent-store-timing-test--alone (&rest body)
  "Run BODY with fresh timing state, no backend and no timer started."
  (declare (indent 0) (debug t))
  `(let ((magent-store-current-backend nil)
         (magent-store-timing-enabled t)
         (magent-store-timing--queue nil)
         (magent-store-timing--timer 'pending) ; no timer: nothing is sent
         (magent-store-timing--turn nil)
         (magent-store-timing--turn-start 0.0)
         (magent-store-timing--last-turn nil)
         (magent-store-timing--ordinals (make-hash-table :test #'equal))
         (magent-store-timing--next-ordinal 0))
     ,@body))

(ert-deftest magent-store-timing-a-record-is-in-the-turn-in-progress ()
  "A record without :turn-id belongs to the turn in progress; one with it, to that turn."
  (magent-store-timing-test--alone
    (setq magent-store-timing--turn "turn-now")
    (should (magent-store-record-timing 'acp-update :count 1))
    (setq magent-store-timing--turn nil)
    (should (magent-store-record-timing 'acp-update :turn-id "turn-given" :count 2))
    (should (equal (mapcar #'cadr (reverse magent-store-timing--queue))
                   '("turn-now" "turn-given")))))

(ert-deftest magent-store-timing-without-a-backend-keeps-the-newest-records ()
  "With no backend to send to, the queue keeps only the newest records, as many as allowed."
  (magent-store-timing-test--alone
    (let ((magent-store-timing-max-queued 2))
      (dotimes (i 5)
        (magent-store-record-timing 'acp-update :count i :time (+ 100.0 i)))
      (magent-store-timing--send)
      (should-not magent-store-timing--timer)
      (should (equal (mapcar (lambda (r) (plist-get (nthcdr 3 r) :count))
                             magent-store-timing--queue)
                     '(4 3)))
      ;; Fewer than allowed: all kept.
      (setq magent-store-timing--queue (last magent-store-timing--queue))
      (magent-store-timing--send)
      (should (equal (mapcar (lambda (r) (plist-get (nthcdr 3 r) :count))
                             magent-store-timing--queue)
                     '(3))))))

(ert-deftest magent-store-timing-a-save-at-a-turns-edges-is-that-turns ()
  "A save sent at the very start of a turn, of the turn before, or two
seconds after that turn ended, belongs to that turn; a moment later, to none."
  (magent-store-timing-test--alone
    (setq magent-store-timing--turn "t2"
          magent-store-timing--turn-start 200.0
          magent-store-timing--last-turn '("t1" 100.0 150.0))
    (should (equal (magent-store-timing--turn-at 200.0) "t2"))
    (should (equal (magent-store-timing--turn-at 199.0) nil))
    (setq magent-store-timing--turn nil)
    (should (equal (magent-store-timing--turn-at 100.0) "t1"))
    (should (equal (magent-store-timing--turn-at 152.0) "t1"))
    (should (equal (magent-store-timing--turn-at 152.5) nil))
    (should (equal (magent-store-timing--turn-at 99.5) nil))))

(ert-deftest magent-store-timing-turns-calls-and-agents-end-and-are-forgotten ()
  "A turn's end ends it; an ended tool call and a stopped subagent give
up their ordinals, so the same id later gets a new one."
  (magent-store-timing-test--alone
    (let ((ctx (magent-lifecycle-events-context-create :turn-id "t1"))
          (sub (magent-lifecycle-events-context-create
                :turn-id "t1" :subagent-id "sub-a"))
          (magent-lifecycle-events--sinks (list #'magent-store-timing--sink)))
      (magent-store-test-timing-standin-emit 'turn-start 10.0 ctx)
      (should (equal magent-store-timing--turn "t1"))
      (magent-store-test-timing-standin-emit 'tool-call-start 10.5 ctx :call-id "c1")
      (magent-store-test-timing-standin-emit 'tool-call-end 11.0 ctx :call-id "c1"
                                             :status 'completed)
      (should-not (gethash "c1" magent-store-timing--ordinals))
      (magent-store-test-timing-standin-emit 'tool-call-start 11.2 ctx :call-id "c1")
      (magent-store-test-timing-standin-emit 'subagent-start 11.3 sub)
      (magent-store-test-timing-standin-emit 'subagent-stop 11.4 sub)
      (should-not (gethash "sub-a" magent-store-timing--ordinals))
      (magent-store-test-timing-standin-emit 'subagent-start 11.5 sub)
      (magent-store-test-timing-standin-emit 'turn-end 12.0 ctx :status 'completed)
      (should-not magent-store-timing--turn)
      (should (equal magent-store-timing--last-turn '("t1" 10.0 12.0)))
      (should (equal (mapcar (lambda (r) (list (car r) (nthcdr 3 r)))
                             (reverse magent-store-timing--queue))
                     '((turn-start nil)
                       (tool-call-start (:call 1))
                       (tool-call-end (:call 1 :status completed))
                       (tool-call-start (:call 2))
                       (subagent-start (:agent 3))
                       (subagent-stop (:agent 3))
                       (subagent-start (:agent 4))
                       (turn-end (:status completed))))))))

(ert-deftest magent-store-timing-follows-magents-sources-loaded-after-the-mode ()
  "With magent's provider-event loop not loaded yet, the mode waits for it
to load, then advises it and stops waiting; with both sources loaded it
does not wait."
  (let ((magent-lifecycle-events--sinks nil)
        (loop-function (symbol-function 'magent-agent-loop-apply-event))
        (after-load-functions after-load-functions))
    (unwind-protect
        (progn
          (fset 'magent-agent-loop-apply-event nil)
          (magent-store-mode 1)
          (should (memq #'magent-store-timing--sink magent-lifecycle-events--sinks))
          (should (memq #'magent-store-timing--after-load after-load-functions))
          ;; Another file loads: still waiting.
          ;; `features' is not special under lexical binding: `dlet'.
          (dlet ((features (remq 'magent-agent-loop
                                (remq 'magent-lifecycle-events features))))
            (run-hook-with-args 'after-load-functions "/elsewhere/other.el"))
          (should (memq #'magent-store-timing--after-load after-load-functions))
          ;; magent's loop loads.
          (fset 'magent-agent-loop-apply-event loop-function)
          (dlet ((features (cons 'magent-agent-loop
                                (remq 'magent-lifecycle-events features))))
            (run-hook-with-args 'after-load-functions "/magent/magent-agent-loop.el"))
          (should (advice-member-p #'magent-store-timing--before-apply-event
                                   'magent-agent-loop-apply-event))
          (should-not (memq #'magent-store-timing--after-load after-load-functions))
          ;; Both loaded from the start: no waiting.
          (magent-store-mode -1)
          (magent-store-mode 1)
          (should-not (memq #'magent-store-timing--after-load after-load-functions)))
      (magent-store-mode -1)
      (unless (symbol-function 'magent-agent-loop-apply-event)
        (fset 'magent-agent-loop-apply-event loop-function)))))

(ert-deftest magent-store-timing-flush-cancels-the-pending-send ()
  "Flushing cancels the timer that would send the queue later."
  (magent-store-timing-test--alone
    (let ((magent-store-timing-send-delay 3600)
          timer)
      (setq magent-store-timing--timer nil)
      (unwind-protect
          (progn
            (magent-store-record-timing 'acp-update :count 1)
            (setq timer magent-store-timing--timer)
            (should (memq timer timer-list))
            (magent-store-timing-flush)
            (should-not magent-store-timing--timer)
            (should-not (memq timer timer-list)))
        (when (timerp timer) (cancel-timer timer))))))

(ert-deftest magent-store-timing-report-asks-from-when-only-with-a-prefix ()
  "The report command asks from when only with a prefix argument, passes it
on as --since, and shows its buffer only when typed."
  (magent-store-timing-test--with-backend
    (magent-store-mode 1)
    (let ((asked 0)
          (commands nil))
      (cl-letf (((symbol-function 'read-string)
                 (lambda (&rest _) (cl-incf asked) "7d")))
        (advice-add 'call-process :before
                    (lambda (&rest args) (push args commands))
                    '((name . magent-store-timing-report-test)))
        (unwind-protect
            (progn
              (let ((buffer (magent-store-timing-report)))
                (should-not (get-buffer-window buffer))
                (kill-buffer buffer))
              (let* ((noninteractive nil)
                     (current-prefix-arg nil)
                     (buffer (call-interactively #'magent-store-timing-report)))
                (should (= asked 0))
                (should (get-buffer-window buffer))
                (should (equal (last (car commands)) '("report")))
                (kill-buffer buffer))
              (let* ((noninteractive nil)
                     (current-prefix-arg '(4))
                     (buffer (call-interactively #'magent-store-timing-report)))
                (should (= asked 1))
                (should (equal (last (car commands) 3) '("report" "--since" "7d")))
                (with-current-buffer buffer
                  (should (> (buffer-size) 0)))
                (kill-buffer buffer)))
          (advice-remove 'call-process 'magent-store-timing-report-test))))))

(provide 'magent-store-timing-tests)
;;; magent-store-timing-tests.el ends here
