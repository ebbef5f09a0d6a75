;;; magent-store-tests.el --- ERT tests for the magent-store shim  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Every test runs against the real backend process (no mocks): a fresh
;; session root and state directory per test, the backend started by the
;; shim exactly as a user's Emacs starts it.  `make test-elisp' sets
;; `magent-store-test-python' to the checkout's .venv/bin/magent-store.
;;
;; magent itself is not needed: the advice test stands in for it with
;; functions of magent's names and signatures.

;;; Code:

(require 'magent-store-test)
(require 'magent-store-layout)

;;;; Tests

(ert-deftest magent-store-a-reply-forgets-its-handlers ()
  "A call's reply, or its error, is handled once and then forgotten:
nothing is kept of a call that was answered."
  (magent-store-test-with-backend ()
    (magent-store-ensure-backend)
    (let ((replies (magent-store-backend-replies magent-store-current-backend)))
      (dotimes (_ 3)
        (should (stringp (magent-store-call "status" nil))))
      (should (string-match-p "no-such-method"
                              (cadr (should-error (magent-store-call "no-such-method" nil)))))
      (should (= (hash-table-count replies) 0)))))

(ert-deftest magent-store-tokens-come-from-randomness-read-once ()
  "A backend's token is derived from 64 random bytes the system gives,
read once: each later token differs, and costs no subprocess."
  (let ((magent-store--token-key nil)
        (magent-store--token-count 0)
        (reads 0))
    (advice-add 'call-process :before
                (lambda (program &rest _)
                  (when (equal program "head") (cl-incf reads)))
                '((name . magent-store-token-test)))
    (unwind-protect
        (let ((first (magent-store--token))
              (key magent-store--token-key)
              (second (magent-store--token)))
          (should (string-match-p "\\`[0-9a-f]\\{128\\}\\'" key))
          (should (= reads 1))
          (should (equal key magent-store--token-key))
          (dolist (token (list first second))
            (should (string-match-p "\\`[0-9a-f]\\{64\\}\\'" token)))
          (should-not (equal first second)))
      (advice-remove 'call-process 'magent-store-token-test))))

(ert-deftest magent-store-a-backend-printing-no-port-is-stopped-and-said ()
  "A backend command that prints pages but no port (a traceback, say) is
stopped once it has printed 4 kB, and the error says what it printed."
  (magent-store-test-with-backend
      ((magent-store-python
        (list (executable-find "sh") "-c"
              "head -c 5000 /dev/zero | tr '\\0' x; echo; exec sleep 600" "sh"))
       ;; Only a bound: the failure comes as soon as the text does.
       (magent-store-call-timeout 20))
    (unwind-protect
        (let ((message (condition-case err
                           (progn (magent-store-ready-backend) "started")
                         (error (error-message-string err)))))
          (should (string-match-p "the backend printed no port: x\\{200\\} " message))
          (should-not (process-live-p
                       (magent-store-backend-process magent-store-current-backend))))
      ;; The stopped command's sentinel restarts it: not in the tests after
      ;; this one.  Stopping, the backend's later sentinel does nothing.
      (when magent-store-current-backend
        (magent-store--kill-backend magent-store-current-backend))
      (cancel-function-timers #'magent-store--recover))))

(ert-deftest magent-store-a-backend-may-print-a-line-before-its-port ()
  "A line the backend command prints before its port (a warning, say) is
no failure: the backend starts once the port comes."
  (magent-store-test-with-backend
      ((go (expand-file-name "go" tmp))
       (magent-store-python
        (list (executable-find "sh") "-c"
              (concat "echo 'a warning first'; "
                      "while [ ! -e \"$GO\" ]; do sleep 0.05; done; exec \"$0\" \"$@\"")
              magent-store-python))
       (process-environment (cons (concat "GO=" go) process-environment)))
    (let ((backend (magent-store-ensure-backend)))
      ;; The line has reached Emacs before the port is printed.
      (with-timeout (30 (error "The first line never came"))
        (while (not (string-match-p "a warning first"
                                    (or (magent-store-backend-output backend) "")))
          (accept-process-output (magent-store-backend-process backend) 0.05)))
      (write-region "" nil go nil 'silent)
      (should (eq (magent-store-ready-backend) backend))
      (should (stringp (magent-store-call "status" nil))))))

(ert-deftest magent-store-a-killed-backend-leaves-nothing-behind ()
  "A backend killed (hung, or replaced) is forgotten, its process and
connection are gone, and so is the connection's buffer."
  (magent-store-test-with-backend ()
    (let* ((backend (magent-store-ready-backend))
           (connection (magent-store-backend-connection backend))
           (buffer (process-buffer connection))
           (process (magent-store-backend-process backend)))
      (should (process-live-p process))
      (should (buffer-live-p buffer))
      (magent-store--kill-backend backend)
      (should-not magent-store-current-backend)
      (should (magent-store-backend-stopping backend))
      (should-not (process-live-p connection))
      (should-not (buffer-live-p buffer))
      (should-not (process-live-p process))
      ;; No backend: nothing to do, and no error.
      (magent-store--kill-backend nil))))

(ert-deftest magent-store-start-as-a-command-says-where-the-backend-runs ()
  "Typed, `magent-store-start' starts the installed backend and says its
pid and port; from Lisp it says nothing."
  (magent-store-test-with-backend ()
    (let ((messages nil))
      (cl-letf (((symbol-function 'y-or-n-p)
                 (lambda (&rest _) (error "Asked to install an installed backend"))))
        (advice-add 'message :before
                    (lambda (format &rest args)
                      (when format (push (apply #'format-message format args) messages)))
                    '((name . magent-store-start-test)))
        (unwind-protect
            (let ((backend (call-interactively #'magent-store-start)))
              (should (magent-store-ready-p backend))
              (should (equal messages
                             (list (format "magent-store: backend pid %s on port %s"
                                           (magent-store-backend-pid backend)
                                           (magent-store-backend-port backend)))))
              (setq messages nil)
              (should (eq (magent-store-start) backend))
              (should-not messages))
          (advice-remove 'message 'magent-store-start-test))))))

(ert-deftest magent-store-a-backend-of-another-version-is-named ()
  "A backend of this package's version starts with nothing to say; one of
another version is named, with how to install the matching one."
  (magent-store-test-with-backend ()
    (magent-store-ready-backend)
    (should-not magent-store-last-error)
    (magent-store-stop)
    (let ((magent-store-version "0.0.0-other"))
      (magent-store-ready-backend)
      (should (string-match-p
               "\\`the backend (.+) is version .+, this package is version 0\\.0\\.0-other: \
M-x magent-store-install-backend installs the matching backend\\'"
               magent-store-last-error)))))

(ert-deftest magent-store-waiting-for-a-backend-that-exited-waits-no-more ()
  "Waiting for a backend to exit returns at once when it has exited."
  (magent-store-test-with-backend ()
    (let* ((backend (magent-store-ready-backend))
           (process (magent-store-backend-process backend))
           (waits 0))
      (magent-store-stop)
      (should-not (process-live-p process))
      (advice-add 'accept-process-output :before (lambda (&rest _) (cl-incf waits))
                  '((name . magent-store-exit-test)))
      (unwind-protect
          (magent-store--await-exit backend)
        (advice-remove 'accept-process-output 'magent-store-exit-test))
      (should (= waits 0)))))

(ert-deftest magent-store-stream-stop-start-load-is-identical ()
  "Chunks streamed with real timers survive a backend stop and start."
  (magent-store-test--with-backend
    (should (equal (magent-store-open "s-roundtrip") 0))
    (magent-store-test--start-turn "s-roundtrip")
    (magent-store-test--stream "s-roundtrip" magent-store-test--chunks 0.005)
    (should (= (magent-store-flush "s-roundtrip") 43))
    (let* ((before (magent-store-load "s-roundtrip"))
           (turn (aref (alist-get 'turns (plist-get before :snapshot)) 0))
           (item (aref (alist-get 'items turn) 0)))
      (should (equal (magent-store-test--content before)
                     (apply #'concat magent-store-test--chunks)))
      ;; Chunk times travel as milliseconds and come back as seconds.
      (should (< (abs (- (alist-get 'updated-at item) (float-time))) 60))
      (magent-store-stop)
      (should-not magent-store-current-backend)
      (magent-store-start)
      (let ((after (magent-store-load "s-roundtrip")))
        (should (equal after before))))
    ;; And what is on disk is what the command-line tool reads.
    (magent-store-stop)
    (should (equal (magent-store-test--content
                    (list :snapshot (magent-store-test--show "s-roundtrip")))
                   (apply #'concat magent-store-test--chunks)))))

(ert-deftest magent-store-a-ready-backend-has-made-the-roots-store-before-any-session ()
  "Once the backend is ready, it makes the root's store and search index.
The first session's open then finds them made: magent's first save does
not wait while the backend makes them."
  (magent-store-test--with-backend
    (magent-store-start)
    ;; A connection's calls are answered in order: the shim's prepare,
    ;; sent when the backend took the token, came before this one.
    (let ((status (json-parse-string (magent-store-call "status" nil))))
      (should (equal (gethash "open-sessions" status) [])))
    (should (file-expand-wildcards
             (expand-file-name "state/magent-store/roots/*/search" tmp)))
    (should-not (file-expand-wildcards
                 (expand-file-name "global/*" magent-store-root)))))

;; One function names a scope's directory, for every file of the package:
;; where the backend writes a session of that scope.
(ert-deftest magent-store-scope-directory-is-where-the-backend-writes-the-scope ()
  "Each kind of scope's directory holds the session the backend wrote under it."
  (magent-store-test--with-backend
    (let ((scopes (list 'global "/src/app" '(action . "  review it: now! "))))
      (dolist (scope scopes)
        (should (equal (magent-store-open "s-here" scope) 0))
        (magent-store-test--start-turn "s-here")
        (magent-store-flush "s-here")
        (magent-store-close "s-here")
        (should (file-exists-p
                 (expand-file-name "s-here.json" (magent-store-scope-directory scope))))
        (delete-file (expand-file-name "s-here.json" (magent-store-scope-directory scope))))
      (should (equal (magent-store-scope-directory '(action . "  review it: now! ") "/r/")
                     "/r/actions/review-it-now-"))
      (should (equal (magent-store-scope-directory nil "/r") "/r/global"))
      ;; Every directory that holds sessions, global's first; nothing else of the root.
      (make-directory (expand-file-name ".search" (magent-store-session-root)) t)
      (should (equal (magent-store-scope-directory '*)
                     (mapcar #'magent-store-scope-directory
                             (list 'global "/src/app" '(action . "review it: now!"))))))))

(ert-deftest magent-store-session-files-are-where-the-backend-writes-them ()
  "A session's header and log are the files the layout names for it; a
scope's headers and the projects' directories are those of the root."
  (magent-store-test--with-backend
    (should (equal (magent-store-open "s-files" "/src/app") 0))
    (magent-store-test--start-turn "s-files")
    (magent-store-flush "s-files")
    (magent-store-close "s-files")
    (let ((root (magent-store-session-root))
          (directory (magent-store-scope-directory "/src/app"))
          (empty (make-temp-file "magent-store-empty-root" t)))
      (unwind-protect
          (progn
            (should (file-exists-p (magent-store-session-file 'header "s-files" directory)))
            ;; The log: one event a line, the first of seq 1.
            (with-temp-buffer
              (insert-file-contents (magent-store-session-file 'log "s-files" directory))
              (should (looking-at-p "{\"seq\":1,")))
            (should (equal (magent-store-session-file 'snapshot "s-files" "/r/global")
                           "/r/global/s-files.snapshot"))
            (should-error (magent-store-session-file 'lock "s-files" directory))
            (write-region "" nil (expand-file-name "s-files.json.tmp-1" directory))
            (should (equal (magent-store-session-headers directory)
                           (list (magent-store-session-file 'header "s-files" directory))))
            ;; A project's directory only: not a file, not a hidden directory.
            (make-directory (expand-file-name "projects/.hidden" root) t)
            (write-region "" nil (expand-file-name "projects/stray" root))
            (should (equal (magent-store-project-directories) (list directory)))
            (should (equal (magent-store-project-directories root) (list directory)))
            (should-not (magent-store-project-directories empty)))
        (delete-directory empty t)))))

;; The flush timers are taken from `run-at-time' and fired by the test:
;; what is asserted is the order of events (requests, timer, flush), on a
;; clock the test drives, never how fast this machine is.
(defun magent-store-test--capture-flush-timers (captured)
  "Return `run-at-time' advice that takes flush timers into CAPTURED.
CAPTURED is a cons whose car is the list of (DELAY . TIMER), newest
first; the timers are made but never started.  Other timers start."
  (lambda (orig time repeat function &rest args)
    (if (eq function 'magent-store--tick)
        (let ((timer (timer-create)))
          (timer-set-function timer function args)
          (push (cons time timer) (car captured))
          timer)
      (apply orig time repeat function args))))

(ert-deftest magent-store-flush-timer-coalesces-without-postponing ()
  "Requests join the scheduled flush, which the timer then sends on time."
  (magent-store-test--with-backend
    (let* ((session (magent-store-test--session "s-timer"))
           ;; No deadline passes by itself while the test runs: only the
           ;; timer it fires, and the clock it gives, move time on.
           (magent-store-flush-interval 3600.0)
           (captured (list nil))
           (flushes (magent-store--session-flushes session))
           deadline)
      (advice-add 'run-at-time :around
                  (magent-store-test--capture-flush-timers captured)
                  '((name . magent-store-test-timers)))
      (unwind-protect
          (progn
            ;; The first chunk schedules one flush: a timer (not an idle
            ;; one), a little after the deadline one interval on.
            (magent-store-append-item-content "s-timer" "item-1"
                                              (car magent-store-test--chunks))
            (magent-store-request-flush "s-timer")
            (should (= (length (car captured)) 1))
            (should (= (car (car (car captured)))
                       (* 1.4 magent-store-flush-interval)))
            (setq deadline (magent-store--session-deadline session))
            (should deadline)
            ;; Every later chunk and request joins it: no second timer,
            ;; the deadline where it was, nothing sent.
            (dolist (chunk (cdr (seq-take magent-store-test--chunks 20)))
              (magent-store-append-item-content "s-timer" "item-1" chunk)
              (magent-store-request-flush "s-timer"))
            (should (= (length (car captured)) 1))
            (should (eql (magent-store--session-deadline session) deadline))
            (should (= (magent-store--session-flushes session) flushes))
            ;; The timer fires: one flush, all 20 chunks in it.
            (let ((timer (cdr (car (car captured)))))
              (apply (timer--function timer) (timer--args timer)))
            (should (= (magent-store--session-flushes session) (1+ flushes)))
            (should-not (magent-store--session-deadline session))
            (should-not (magent-store--session-timer session))
            (with-timeout (10 (ert-fail "the flush was not answered"))
              (while (magent-store--session-inflight session)
                (accept-process-output nil 0.05)))
            (should (= (magent-store--session-durable-seq session) 23))
            ;; The next chunk schedules the next flush; one arriving at
            ;; its deadline (the clock given here) sends it at once and
            ;; stops its timer.
            (magent-store-append-item-content "s-timer" "item-1"
                                              (nth 20 magent-store-test--chunks))
            (should (= (length (car captured)) 2))
            (setq deadline (magent-store--session-deadline session))
            (magent-store--push-chunk session "item-1"
                                      (nth 21 magent-store-test--chunks)
                                      nil deadline)
            (should (= (magent-store--session-flushes session) (+ 2 flushes)))
            (should-not (magent-store--session-timer session))
            (should (timer--triggered (cdr (car (car captured))))))
        (advice-remove 'run-at-time 'magent-store-test-timers))
      (should (= (magent-store-flush "s-timer") 25))
      (should (equal (magent-store-test--content (magent-store-load "s-timer"))
                     (apply #'concat (seq-take magent-store-test--chunks 22)))))))

(ert-deftest magent-store-large-batch-travels-as-a-private-file ()
  "A batch over `magent-store-file-threshold' goes through the spool."
  (magent-store-test--with-backend
    (let ((magent-store-file-threshold 100)
          (big (apply #'concat (make-list 2000 "tool output \"x\" é\n")))
          sent)
      (magent-store-open "s-file")
      (magent-store-test--start-turn "s-file")
      (advice-add 'magent-store-spool-file :filter-return
                  (lambda (file) (push file sent) file)
                  '((name . magent-store-test)))
      (unwind-protect
          (progn
            (magent-store-append-item-content "s-file" "item-1" big t)
            (should (= (magent-store-flush "s-file") 4)))
        (advice-remove 'magent-store-spool-file 'magent-store-test))
      (should (= (length sent) 1))
      (should-not (file-exists-p (car sent)))  ; the backend removed it
      (should (equal (file-modes (file-name-directory (car sent))) #o700))
      (let* ((snapshot (plist-get (magent-store-load "s-file") :snapshot))
             (item (aref (alist-get 'items (aref (alist-get 'turns snapshot) 0))
                         0)))
        (should (equal (alist-get 'output item) big))))))

;;;; The mode, with a stand-in for magent

(defvar magent-store-test--calls nil
  "Stand-in magent functions record their calls here.")

(defun magent-thread-session-id (thread) (plist-get thread :session-id))
(defun magent-thread-scope (thread) (plist-get thread :scope))
(defun magent-thread-item-id (item) (plist-get item :id))
(defun magent-thread-event-to-alist (event) event)
(defun magent-session-get-id (session) (plist-get session :id))
(defun magent-session-thread-ledger (session) (plist-get session :thread))
(defun magent-thread-turns (thread) (plist-get thread :turns))
(defun magent-session-metadata (session) (plist-get session :metadata))
(defun magent-session-agent-jobs (session) (plist-get session :agent-jobs))
(defun magent-session-approval-overrides (session)
  (plist-get session :approval-overrides))
(defun magent-thread-append-event (_thread event)
  (push 'append-event magent-store-test--calls)
  event)
(defun magent-thread-append-item-content (_thread _item _chunk &optional _output-p)
  (push 'append-content magent-store-test--calls))
(defun magent-session-save-deferred-for-session (_session &optional _scope _delay)
  (push 'magent-deferred-save magent-store-test--calls))
(defun magent-session-save-for-session (_session _scope)
  (push 'magent-save magent-store-test--calls))
(defun magent-session-read-file (filepath)
  ;; magent reads the schema-7 files itself: read them as it would.
  (push 'magent-load magent-store-test--calls)
  (magent-store-test--show (file-name-base filepath)))

(ert-deftest magent-store-mode-routes-magent-persistence ()
  "The mode's advice forwards events and chunks; turning it off removes it."
  (magent-store-test--with-backend
    (let* ((thread (list :session-id "s-mode" :scope 'global))
           (session (list :id "s-mode" :thread thread))
           (item (list :id "item-1"))
           (magent-store-test--calls nil))
      (unwind-protect
          (progn
            (magent-store-mode 1)
            (magent-thread-append-event
             thread (magent-store-test--event "thread-started"))
            (magent-thread-append-event
             thread (magent-store-test--event
                     "turn-started" :turn-id "turn-1"
                     :payload `((turn . ,(magent-store-test--turn "turn-1")))))
            (magent-thread-append-event
             thread (magent-store-test--event
                     "item-started" :turn-id "turn-1" :item-id "item-1"
                     :payload `((item . ,(magent-store-test--item
                                          "item-1" "turn-1")))))
            (dolist (chunk '("Hello" ", " "world"))
              (magent-thread-append-item-content thread item chunk)
              (magent-session-save-deferred-for-session session)
              (sleep-for 0.01))
            (magent-thread-append-item-content thread item "tool says" t)
            (magent-session-save-for-session session 'global)
            ;; magent's own appends ran; its saves were replaced.
            (should (equal (reverse magent-store-test--calls)
                           '(append-event append-event append-event
                                          append-content append-content
                                          append-content append-content)))
            (setq magent-store-test--calls nil)
            (let* ((snapshot (magent-store-test--show "s-mode"))
                   (item (aref (alist-get 'items
                                          (aref (alist-get 'turns snapshot) 0))
                               0)))
              (should (equal (alist-get 'content item) "Hello, world"))
              (should (equal (alist-get 'output item) "tool says")))
            (should (equal (alist-get 'id (magent-store-test--show
                                           "s-mode" "--header"))
                           "s-mode"))
            ;; A chunk nobody asked to save is on disk before magent loads.
            (magent-thread-append-item-content thread item "!")
            (let* ((loaded (magent-session-read-file
                            (expand-file-name "global/s-mode.json"
                                              magent-store-root)))
                   (item (aref (alist-get 'items
                                          (aref (alist-get 'turns loaded) 0))
                               0)))
              (should (equal (alist-get 'content item) "Hello, world!"))))
        (magent-store-mode -1))
      (dolist (row magent-store-magent-functions)
        (when (keywordp (nth 1 row))
          (should-not (advice-member-p (nth 2 row) (nth 0 row)))))
      (should-not (memq #'magent-store-save-at-exit kill-emacs-hook))
      (setq magent-store-test--calls nil)
      (magent-thread-append-item-content thread item "not forwarded")
      (should (equal magent-store-test--calls '(append-content)))
      (should (zerop (magent-store--session-fill
                      (gethash "s-mode" magent-store--sessions)))))))

(ert-deftest magent-store-backend-killed-mid-stream-loses-nothing ()
  "kill -9 of the backend mid-stream: restarted, every chunk once."
  (magent-store-test--with-backend
    (magent-store-open "s-kill")
    (magent-store-test--start-turn "s-kill")
    (let* ((chunks magent-store-test--chunks)
           (first-pid (magent-store-backend-pid magent-store-current-backend)))
      (magent-store-test--stream "s-kill" (seq-take chunks 15) 0.02)
      (signal-process first-pid 'SIGKILL)
      (magent-store-test--stream "s-kill" (seq-drop chunks 15) 0.02)
      (sleep-for 0.3)
      (should magent-store-current-backend)
      (should-not (equal (magent-store-backend-pid magent-store-current-backend)
                         first-pid))
      (should (= (magent-store-flush "s-kill") 43))
      (should (equal (magent-store-test--content (magent-store-load "s-kill"))
                     (apply #'concat chunks))))))

;; What the backend held only in memory when it died must come back from
;; Emacs: the header is written at the next flush, so a crash before it
;; loses the title unless the restarted backend is given it again.
(ert-deftest magent-store-header-put-before-a-backend-crash-is-kept ()
  "A header put but not yet flushed when the backend dies is on disk after."
  (magent-store-test--with-backend
    (magent-store-test--session "s-header")
    (let ((first-pid (magent-store-backend-pid magent-store-current-backend)))
      (magent-store-put-header "s-header" '((title . "Kept across a crash")))
      (signal-process first-pid 'SIGKILL)
      (with-timeout (10 (ert-fail "the backend was not restarted"))
        (while (or (null magent-store-current-backend)
                   (equal (magent-store-backend-pid magent-store-current-backend)
                          first-pid))
          (accept-process-output nil 0.05)))
      (magent-store-append-item-content "s-header" "item-1" "after the crash")
      (magent-store-flush "s-header")
      (should (equal (alist-get 'title (plist-get (magent-store-load "s-header")
                                                  :header))
                     "Kept across a crash"))
      (should (equal (magent-store-test--content (magent-store-load "s-header"))
                     "after the crash")))
    (magent-store-stop)
    (should (equal (alist-get 'title (magent-store-test--show "s-header"
                                                              "--header"))
                   "Kept across a crash"))))

(provide 'magent-store-tests)
;;; magent-store-tests.el ends here
