;;; magent-store-resume-crash-child.el --- A magent session streaming until it is killed  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Run by magent-store-resume-tests.el in a child `emacs --batch', which
;; the test kills with SIGKILL in the middle of a streamed reply.  With
;; `magent-store-mode' on and upstream magent's own code: one completed
;; turn, saved; then a second turn whose reply streams a chunk every
;; 10 ms, forever.  Each chunk sent is recorded (index and time) in the
;; progress file, so that the test knows what Emacs had when it died.
;; Environment: MAGENT_LISP, RESUME_ROOT (the session root),
;; RESUME_PROGRESS (the progress file), RESUME_PYTHON (the backend).

;;; Code:

(require 'magent-store-test-upstream)
(require 'magent-store-test-backend)
(magent-store-test-upstream-load)
(require 'magent-agent-job)
(require 'magent-store)

(defvar magent-session-directory)

(setq magent-session-directory (getenv "RESUME_ROOT")
      magent-store-python (getenv "RESUME_PYTHON")
      magent-store-flush-interval 0.05)
(magent-store-mode 1)

(let* ((session (magent-session-create :id "20261130-130000-crash"))
       (thread (magent-session-thread-ledger session))
       (progress (getenv "RESUME_PROGRESS")))
  (let* ((turn (magent-thread-queue-turn thread "First question"))
         (id (magent-thread-turn-id turn)))
    (magent-thread-start-turn thread id)
    (let ((item (magent-thread-start-item thread id 'message :role 'assistant)))
      (magent-thread-append-item-content thread item "First answer.")
      (magent-thread-complete-item thread item :content "First answer."))
    (magent-thread-complete-turn thread id))
  (magent-session-save-for-session session 'global)
  (let* ((turn (magent-thread-queue-turn thread "Second question"))
         (id (magent-thread-turn-id turn))
         (item nil)
         (n 0))
    (magent-thread-start-turn thread id)
    (setq item (magent-thread-start-item thread id 'message :role 'assistant))
    (magent-session-save-deferred-for-session session 'global)
    (while t
      ;; Recorded before it is appended: a chunk may reach the backend
      ;; inside the call that appends it (the first chunk after a flush
      ;; falls due sends the batch), so a kill between the two must find it
      ;; already counted as sent.
      (write-region (format "%d %f\n" n (float-time)) nil progress t 'silent)
      (magent-thread-append-item-content thread item (format "chunk %04d é\n" n))
      (magent-session-save-deferred-for-session session 'global)
      (setq n (1+ n))
      ;; Timers and process output run here, as in an interactive Emacs.
      (sit-for 0.01))))

;;; magent-store-resume-crash-child.el ends here
