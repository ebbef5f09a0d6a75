;;; magent-store-status-tests.el --- ERT: what the status buffer and stop say  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The status buffer and `magent-store-stop' against a real backend:
;; nothing blank or nil before the first flush, percentiles in order,
;; and a stop that says what it did and leaves no stale error behind.

;;; Code:

(require 'cl-lib)
(require 'ert)

(require 'magent-store-test-backend)
(require 'magent-store-status)

(defun magent-store-status-test--text ()
  "Return the status buffer's text after `magent-store-status'."
  (save-window-excursion
    (magent-store-status)
    (with-current-buffer "*magent-store-status*" (buffer-string))))

(defmacro magent-store-status-test--with-backend (messages &rest body)
  "Run BODY against a fresh backend, its messages collected in MESSAGES."
  (declare (indent 1) (debug t))
  `(magent-store-test-with-backend ((magent-store-test-stop-argument '(4))
                                    (,messages nil))
     (cl-letf (((symbol-function 'message)
                (lambda (format &rest args)
                  (when format
                    (push (apply #'format-message format args) ,messages)))))
       ,@body)))

(ert-deftest magent-store-status-says-what-it-knows-and-stop-says-what-it-did ()
  (magent-store-status-test--with-backend messages
    (magent-store-start)
    (let ((text (magent-store-status-test--text)))
      (should (string-match-p "^Open sessions: +none$" text))
      (should (string-match-p "^Flush (backend): +no flush yet$" text))
      (should (string-match-p "^Acknowledged after: no flush yet$" text))
      (should-not (string-match-p "\\_<nil\\_>" text)))
    (magent-store-open "s1")
    (magent-store-put-header "s1" '((id . "s1") (schema-version . 7)))
    (dotimes (_ 3) (magent-store-flush "s1"))
    (let ((text (magent-store-status-test--text)))
      (should (string-match-p "^Open sessions: +s1$" text))
      (should (string-match-p
               "^Bytes written: +[0-9]+ ([0-9.]+ \\(?:B\\|KiB\\|MiB\\)\\|[0-9]+ ([0-9.]+ KiB)"
               text))
      (dolist (line '("Flush (backend): +" "Acknowledged after: "))
        (should (string-match
                 (concat "^" line "last \\([0-9.]+\\), median \\([0-9.]+\\), p99 \\([0-9.]+\\) ms")
                 text))
        (should (<= (string-to-number (match-string 2 text))
                    (string-to-number (match-string 3 text))))))
    ;; An error from before a deliberate stop is not shown after it.
    (setq magent-store-last-error "an old error")
    (setq messages nil)
    (magent-store-stop)
    (should (equal messages '("magent-store: backend stopped, 1 session flushed")))
    ;; The backend exited by itself, its spool directory removed.
    (should-not (file-expand-wildcards
                 (expand-file-name "state/magent-store/spool-*" tmp)))
    (let ((text (magent-store-status-test--text)))
      (should (string-match-p "^Backend: not running$" text))
      (should (string-match-p "^Last error: +none$" text)))
    (setq messages nil)
    (magent-store-stop)
    (should (equal messages '("magent-store: the backend was not running")))))

;; A disk nearly full: the search index pauses and the status buffer says
;; why, then space returns and it says the index is kept current again.
;; Needs a tmpfs, so root.
(ert-deftest magent-store-status-says-when-the-search-index-is-paused ()
  (skip-unless (and (zerop (user-uid)) (executable-find "mount")))
  ;; The session root and the state directory (where the index is kept) on one small disk.
  (magent-store-test-with-backend ((disk (expand-file-name "disk" tmp))
                                   (magent-store-root (expand-file-name "root" disk))
                                   (process-environment
                                    (cons (concat "XDG_STATE_HOME=" (expand-file-name "state" disk))
                                          process-environment))
                                   (filler (expand-file-name "filler" magent-store-root))
                                   (seq 0))
    (make-directory disk)
    (should (zerop (call-process "mount" nil nil nil "-t" "tmpfs" "-o" "size=4m,mode=0700"
                                 "tmpfs" disk)))
    (make-directory magent-store-root)
    (cl-flet ((save (type)
                (magent-store-append-event
                 "s1" `((seq) (type . ,type) (thread-id . "thread-1") (turn-id) (item-id)
                        (payload . ,(and (equal type "thread-status-changed")
                                         '((status . "idle"))))
                        (created-at . ,(cl-incf seq))))
                (magent-store-flush "s1"))
              (shows (regexp)
                (let ((deadline (+ (float-time) 10)))
                  (while (and (not (string-match-p regexp (magent-store-status-test--text)))
                              (< (float-time) deadline))
                    (sleep-for 0.05)))
                (string-match-p regexp (magent-store-status-test--text))))
      (unwind-protect
          (progn
            (magent-store-start)
            (magent-store-open "s1")
            (save "thread-started")
            (should (shows "^Search index: +kept current$"))
            (let* ((info (file-system-info magent-store-root))
                   (floor (/ (nth 0 info) 20)))
              (let ((coding-system-for-write 'binary))
                (write-region (make-string (- (nth 2 info) (/ floor 2)) 0) nil filler nil 'silent)))
            (save "thread-status-changed")
            (should (shows "^Search index: +search index paused: [0-9]+ bytes free on the file system of "))
            (delete-file filler)
            (save "thread-status-changed")
            (should (shows "^Search index: +kept current$")))
        (ignore-errors (magent-store-stop))
        (call-process "umount" nil nil nil "-l" disk)))))

(ert-deftest magent-store-percentile-interpolates-and-never-falls-below-the-median ()
  (should-not (magent-store-status--percentile nil 50))
  (should (< (abs (- (magent-store-status--percentile '(6.2 4.9) 50) 5.55)) 1e-9))
  (should (< (abs (- (magent-store-status--percentile '(4.9 6.2) 99) 6.187)) 1e-9))
  (let ((numbers (number-sequence 101 1 -1)))  ; 1..101: the P-th is P + 1
    (dolist (p '(0 1 50 89 90 91 99 100))
      (should (= (magent-store-status--percentile numbers p) (1+ p))))
    (should (equal numbers (number-sequence 101 1 -1))))) ; left as it was

(ert-deftest magent-store-status-a-header-refused-at-opening-is-said ()
  "A header the backend refuses is said, also when it went with the opening."
  (magent-store-status-test--with-backend messages
    (magent-store-start)
    ;; Opened without waiting: the header goes once the session is open.
    (magent-store-ensure-session "s-bad" 'global)
    (magent-store-put-header "s-bad" '((id . "s-bad")
                                       (approval-overrides
                                        . [((tool . "grep") (decision . "maybe"))])))
    (magent-store-append-event "s-bad" '((type . "thread-started")
                                         (thread-id . "s-bad")
                                         (created-at . 1.0e9)))
    (magent-store-flush "s-bad")
    (should (string-match-p "approval-overrides" (or magent-store-last-error "")))
    (should (cl-find-if (lambda (text)
                          (string-match-p "header of s-bad refused: .*approval-overrides"
                                          text))
                        messages))))

(ert-deftest magent-store-status-shows-restarts-and-why ()
  "After the backend is killed, the status says how often, when and why."
  (magent-store-status-test--with-backend messages
    (let ((magent-store-stops nil)
          (magent-store--restarts nil)
          (magent-store-gave-up nil))
      (magent-store-open "s1")
      (magent-store-flush "s1")
      (should (string-match-p "^Restarts: +none$" (magent-store-status-test--text)))
      (let ((pid (magent-store-backend-pid magent-store-current-backend)))
        (signal-process pid 'SIGKILL)
        (with-timeout (20 (ert-fail "the backend was not restarted"))
          (while (not (and magent-store-current-backend
                           (not (equal (magent-store-backend-pid
                                        magent-store-current-backend)
                                       pid))
                           (magent-store-ready-p magent-store-current-backend)))
            (accept-process-output nil 0.05))))
      (should (string-match-p
               "^Restarts: +1, last at [0-9-]+ [0-9:]+: the backend was killed by signal 9$"
               (magent-store-status-test--text))))))

(provide 'magent-store-status-tests)
;;; magent-store-status-tests.el ends here
