;;; magent-store-idle-tests.el --- ERT: the idle compaction setting  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store-compact-idle-days': off, turning the mode on starts
;; nothing; on, it runs the real `magent-store compact --idle-days N ROOT'
;; over a real root holding a session idle for 40 days, and a daily
;; timer; a run that fails says so once.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)
(require 'magent-store-magent)
(require 'magent-store-idle)


(defconst magent-store-idle-test--old (- (float-time) (* 40 86400))
  "A time 40 days ago.")

(defun magent-store-idle-test--write-old-session (root)
  "Write a session idle for 40 days under ROOT with the backend's CLI.
Return its log file."
  (let* ((header (expand-file-name "global/old.json" root))
         (time magent-store-idle-test--old)
         (lines
          (mapcar
           (lambda (event)
             (prog1 (json-encode (append event `((created-at . ,time))))
               (setq time (+ time 1))))
           `(((type . "thread-started") (thread-id . "th-old"))
             ((type . "turn-started") (thread-id . "th-old") (turn-id . "t1")
              (payload . ((turn . ((id . "t1") (input . "hello"))))))))))
    (with-temp-buffer
      (insert (mapconcat #'identity lines "\n") "\n")
      (should (eql 0 (apply #'call-process-region (point-min) (point-max)
                            (car (magent-store-program)) nil t nil
                            (append (cdr (magent-store-program))
                                    (list "apply" header))))))
    (let ((log (expand-file-name "global/old.jsonl" root)))
      (should (file-exists-p log))
      (dolist (file (directory-files (expand-file-name "global" root) t "\\`old\\."))
        (set-file-times file (seconds-to-time magent-store-idle-test--old)))
      log)))

(defvar magent-store-idle-test--messages nil
  "The messages shown while a test runs, latest first.")

(defun magent-store-idle-test--record (format &rest args)
  "Record the message FORMAT with ARGS shows."
  (when format
    (push (apply #'format-message format args) magent-store-idle-test--messages)))

(defun magent-store-idle-test--failures ()
  "The messages that said an idle compaction failed."
  (cl-count-if (lambda (m) (string-match-p "idle compaction failed" m))
               magent-store-idle-test--messages))

(defmacro magent-store-idle-test--with-mode (days &rest body)
  "Run BODY with `magent-store-compact-idle-days' DAYS and the mode on."
  (declare (indent 1) (debug t))
  `(magent-store-test--with-backend
     (let ((magent-store-compact-idle-days ,days)
           (magent-store-idle--timer nil)
           (magent-store-idle--process nil)
           (magent-store-idle-test--messages nil))
       (advice-add 'message :before #'magent-store-idle-test--record)
       (unwind-protect
           (progn (magent-store-mode 1) ,@body)
         (advice-remove 'message #'magent-store-idle-test--record)
         (magent-store-mode -1)
         (when (process-live-p magent-store-idle--process)
           (delete-process magent-store-idle--process))))))

(defun magent-store-idle-test--wait ()
  "Wait for the idle compaction process to finish; return it."
  (let ((process magent-store-idle--process))
    (should (processp process))
    (with-timeout (60 (ert-fail "the idle compaction did not finish"))
      (while (process-live-p process)
        (accept-process-output process 0.1)))
    ;; Let its sentinel run.
    (accept-process-output nil 0.05)
    process))

(ert-deftest magent-store-idle-off-starts-nothing ()
  (magent-store-idle-test--with-mode nil
    (let ((log (magent-store-idle-test--write-old-session (magent-store-session-root))))
      (should-not magent-store-idle--process)
      (should-not magent-store-idle--timer)
      (should-not (get-process "magent-store-compact"))
      (should-not (magent-store-idle-compact))
      (should (file-exists-p log)))))

(ert-deftest magent-store-idle-compact-as-a-command-says-it-is-off ()
  "Run as a command while the setting is off, it says what to set; from
Lisp it quietly does nothing."
  (magent-store-idle-test--with-mode nil
    (should-not (magent-store-idle-compact))
    ;; As when typed: batch Emacs counts no call as interactive otherwise.
    (let ((noninteractive nil))
      (should (string-match-p "\\`Set .magent-store-compact-idle-days. to a number of days"
                              (cadr (should-error (call-interactively #'magent-store-idle-compact)
                                                  :type 'user-error)))))))

(ert-deftest magent-store-idle-zero-days-is-off ()
  "Zero days is no compaction at all, not \"every session, now\", and
no daily timer either; turning the mode on says the setting is off."
  (magent-store-idle-test--with-mode 0
    (let ((log (magent-store-idle-test--write-old-session (magent-store-session-root))))
      (should-not magent-store-idle--process)
      (should-not magent-store-idle--timer)
      (should (member (concat "magent-store: idle compaction is off: "
                              "magent-store-compact-idle-days is 0, not a number of days above 0")
                      magent-store-idle-test--messages))
      (should-not (magent-store-idle-compact))
      (should-not (get-process "magent-store-compact"))
      (should (file-exists-p log)))))

(ert-deftest magent-store-idle-on-compacts-when-the-mode-starts-then-daily ()
  (magent-store-idle-test--with-mode 30
    ;; No root yet (no session ever saved): nothing to run, nothing said.
    (should-not magent-store-idle--process)
    (should (timerp magent-store-idle--timer))
    (let ((log (magent-store-idle-test--write-old-session (magent-store-session-root))))
      (magent-store-mode -1)
      (should-not magent-store-idle--timer)
      (magent-store-mode 1)
      (let ((process (magent-store-idle-test--wait)))
        (should (equal (last (process-command process) 4)
                       (list "compact" "--idle-days" "30"
                             (directory-file-name (magent-store-session-root)))))
        (should (equal (butlast (process-command process) 4)
                       (magent-store-program)))
        (should (= 0 (process-exit-status process))))
      ;; Ended, it is no longer the compaction running now.
      (should-not magent-store-idle--process)
      (should-not (file-exists-p log))
      (should (file-exists-p (expand-file-name "global/old.snapshot" (magent-store-session-root))))
      (with-current-buffer magent-store-idle-buffer
        (should (string-match-p "1 idle session(s) compacted" (buffer-string))))
      (should (timerp magent-store-idle--timer))
      (should (equal (timer--repeat-delay magent-store-idle--timer) magent-store-idle-day))
      (should (eq (timer--function magent-store-idle--timer) #'magent-store-idle--daily))
      (should (= 0 (magent-store-idle-test--failures)))
      ;; One line in the echo area: what it compacted, saved and left.
      (let ((said (cl-remove-if-not (lambda (m) (string-prefix-p "magent-store: idle" m))
                                    magent-store-idle-test--messages)))
        (should (= (length said) 1))
        (should (string-match-p (concat "\\`magent-store: idle compaction: 1 idle session(s) compacted, "
                                        "[0-9]+ B saved; 0 recent, 0 compact already, 0 open\\'")
                                (car said))))
      (magent-store-mode -1)
      (should-not magent-store-idle--timer))))

(ert-deftest magent-store-idle-says-in-one-line-what-it-left-and-why ()
  (magent-store-idle-test--with-mode nil
    (let ((log (magent-store-idle-test--write-old-session (magent-store-session-root)))
          (magent-store-compact-idle-days 30))
      (write-region "{\"seq\":" nil log t 'silent)  ; a torn last line: for fsck first
      (set-file-times log (seconds-to-time magent-store-idle-test--old))
      (magent-store-idle-compact)
      (should (= 1 (process-exit-status (magent-store-idle-test--wait))))
      (should (file-exists-p log))
      (should (equal magent-store-idle-test--messages
                     (list (concat "magent-store: idle compaction: 0 idle session(s) compacted, 0 B saved; "
                                   "0 recent, 0 compact already, 0 open, "
                                   "1 damaged (run magent-store fsck)")))))))

(ert-deftest magent-store-idle-a-failed-run-says-so-once ()
  (magent-store-idle-test--with-mode nil
    (let ((magent-store-python (list (executable-find "sh") "-c" "echo broken >&2; exit 1" "sh"))
          (magent-store-compact-idle-days 7))
      (make-directory (magent-store-session-root) t)
      (magent-store-idle-compact)
      (magent-store-idle-test--wait)
      (should (= 1 (magent-store-idle-test--failures)))
      (with-current-buffer magent-store-idle-buffer
        (should (string-match-p "broken" (buffer-string)))))))

(provide 'magent-store-idle-tests)
;;; magent-store-idle-tests.el ends here
