;;; list-generate.el --- Sessions for bench/list_bench.py, saved by magent itself  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; LIST_BENCH_COUNT small sessions under LIST_BENCH_ROOT, built through
;; upstream magent's own API and saved by magent's own
;; `magent-session-save-for-session' (schema 6, the mode off): 3 turns
;; each (the user's question, a tool call, a streamed reply), titled;
;; every fifth in one of five projects, the others global.  Each file's
;; time is set one second after the previous one's, oldest first.
;; MAGENT_LISP names magent's lisp/ folder.

;;; Code:

(require 'cl-lib)
(require 'magent-store-test-upstream)
(magent-store-test-upstream-load)
(require 'magent-agent-job)

(defvar magent-session-directory)

(defun list-generate--converse (session n)
  "Run three turns in SESSION, the Nth session."
  (let ((thread (magent-session-thread-ledger session)))
    (dotimes (k 3)
      (let* ((turn (magent-thread-queue-turn
                    thread (format "Question %d of session %d: why does ünïcode \
matter here?" k n)))
             (id (magent-thread-turn-id turn)))
        (magent-thread-start-turn thread id)
        (when (= k 1)
          (let ((tool (magent-thread-start-item
                       thread id 'tool :name "grep" :call-id (format "call-%d" k)
                       :input '((pattern . "defun") (path . "lisp/")))))
            (magent-thread-complete-item
             thread tool :output "lisp/a.el:1:(defun a ()\nlisp/b.el:9:(defun b ()")))
        (let ((item (magent-thread-start-item thread id 'message :role 'assistant)))
          (dotimes (c 4)
            (magent-thread-append-item-content
             thread item (format "Part %d of the answer to question %d. " c k)))
          (magent-thread-complete-item thread item
                                       :content (magent-thread-item-content item)))
        (magent-thread-complete-turn thread id '(:input-tokens 120))))))

(let ((count (string-to-number (getenv "LIST_BENCH_COUNT")))
      (projects (cl-loop for k below 5 collect (format "/home/user/src/project-%d" k))))
  (setq magent-session-directory (getenv "LIST_BENCH_ROOT"))
  (dotimes (n count)
    (let* ((id (format "20261201-%06d" n))
           (scope (if (= (% n 5) 0) (nth (% (/ n 5) 5) projects) 'global))
           (session (magent-session-create
                     :id id :metadata `((title . ,(format "Session %d: a question" n))))))
      (list-generate--converse session n)
      (magent-session-save-for-session session scope)
      (let ((file (expand-file-name (concat id ".json")
                                    (magent-session--scope-storage-directory scope)))
            (time (+ 1790000000 n)))
        (set-file-times file (list (ash time -16) (logand time #xffff)))))))

;;; list-generate.el ends here
