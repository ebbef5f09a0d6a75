;;; resume-bench.el --- magent's read of a large session: through the store vs its own file  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; One large session, built through upstream magent's own API with
;; `magent-store-mode' on (so the backend stores it), and saved a second
;; time by magent itself (its own schema-6 file, in another root).  Then,
;; in a fresh state, `magent-session-read-file' of each, side by side,
;; alternating, GC included (a full collection before each read, so each
;; read pays for its own garbage): magent reading its own file, and magent
;; reading the store's session (flush, the backend renders it, magent's
;; reader builds it).  Prints both files' sizes, every time, the medians
;; and their ratio.
;;
;;   MAGENT_LISP=<magent>/lisp emacs --batch -Q -L elisp \
;;     -L tests/elisp -l bench/elisp/resume-bench.el
;;
;; RESUME_BENCH_TURNS (default 60) and RESUME_BENCH_KB (assistant text
;; per turn, default 68) size the session; RESUME_BENCH_ROUNDS (default 7).

;;; Code:

(require 'cl-lib)
(require 'magent-store-test-upstream)
(unless (locate-library "epc")
  (dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path dir)))
(magent-store-test-upstream-load)
(require 'magent-agent-job)
(require 'magent-store)

(defvar magent-session-directory)
(defvar magent-session--metadata-cache)
(defvar magent-session--loaded-sessions)

(defun resume-bench--env (name default)
  "Return the number in environment variable NAME, else DEFAULT."
  (let ((value (getenv name)))
    (if (and value (not (string-empty-p value))) (string-to-number value) default)))

(defun resume-bench--median (numbers)
  "Return the median of NUMBERS."
  (let ((sorted (sort (copy-sequence numbers) #'<)))
    (nth (/ (length sorted) 2) sorted)))

(defun resume-bench--build (session turns kb)
  "Stream TURNS turns of KB kilobytes of assistant text each into SESSION."
  (let ((thread (magent-session-thread-ledger session))
        (chunk (concat (make-string 150 ?x) " é ünï \"q\"\n")))
    (dotimes (n turns)
      (let* ((turn (magent-thread-queue-turn thread (format "Question %d" n)))
             (id (magent-thread-turn-id turn)))
        (magent-thread-start-turn thread id)
        (let ((item (magent-thread-start-item thread id 'message :role 'assistant)))
          (dotimes (_ (/ (* kb 1024) (length chunk)))
            (magent-thread-append-item-content thread item chunk))
          (magent-thread-complete-item thread item
                                       :content (magent-thread-item-content item)))
        (let ((tool (magent-thread-start-item thread id 'tool :name "grep"
                                              :input '(:pattern "x"))))
          (magent-thread-complete-item thread tool :output "match: x\n"))
        (magent-thread-complete-turn thread id '(:input-tokens 100))))))

(defun resume-bench--time (function)
  "Return the seconds FUNCTION takes, after a full collection."
  (garbage-collect)
  (let ((start (float-time)))
    (funcall function)
    (- (float-time) start)))

(let* ((tmp (make-temp-file "resume-bench-" t))
       (turns (resume-bench--env "RESUME_BENCH_TURNS" 60))
       (kb (resume-bench--env "RESUME_BENCH_KB" 68))
       (rounds (resume-bench--env "RESUME_BENCH_ROUNDS" 7))
       (id "20261130-150000-big")
       (process-environment (cons (concat "XDG_STATE_HOME=" tmp "/state")
                                  process-environment))
       (magent-session-directory (expand-file-name "sessions" tmp))
       (own-root (expand-file-name "own" tmp))
       (magent-read (advice--cd*r (symbol-function 'magent-session-read-file)))
       own-file store-file own-times store-times)
  (unwind-protect
      (progn
        (magent-store-mode 1)
        (let ((session (magent-session-create :id id :metadata '((title . "Big")))))
          (resume-bench--build session turns kb)
          (magent-session-save-for-session session 'global)
          (let ((magent-session-directory own-root))
            (setq own-file (funcall (advice--cd*r (symbol-function
                                                   'magent-session-save-for-session))
                                    session 'global))))
        (setq store-file (expand-file-name (concat "global/" id ".json")
                                           magent-session-directory))
        (magent-store-stop)
        (clrhash magent-session--metadata-cache)
        (let ((size (lambda (f) (or (file-attribute-size (file-attributes f)) 0)))
              (base (file-name-sans-extension store-file)))
          (message "magent's own file (schema 6): %.2f MB; the store's files: header %.1f KB, snapshot %.2f MB, log %.2f MB"
                   (/ (funcall size own-file) 1e6)
                   (/ (funcall size store-file) 1e3)
                   (/ (funcall size (concat base ".snapshot")) 1e6)
                   (/ (funcall size (concat base ".jsonl")) 1e6)))
        ;; The two reads give the same session.
        (let ((ours (plist-get (magent-session-read-file store-file) :session))
              (theirs (let ((magent-session-directory own-root))
                        (plist-get (funcall magent-read own-file) :session))))
          (unless (equal (magent-thread-snapshot-to-alist
                          (magent-session-thread-ledger ours))
                         (let ((alist (magent-thread-snapshot-to-alist
                                       (magent-session-thread-ledger theirs))))
                           (setf (alist-get 'snapshot-created-at alist)
                                 (alist-get 'snapshot-created-at
                                            (magent-thread-snapshot-to-alist
                                             (magent-session-thread-ledger ours))))
                           (setf (alist-get 'last-event-seq alist)
                                 (magent-thread-last-event-seq
                                  (magent-session-thread-ledger ours)))
                           alist))
            (error "The two reads differ")))
        (dotimes (_ rounds)
          (push (resume-bench--time
                 (lambda () (let ((magent-session-directory own-root))
                              (funcall magent-read own-file))))
                own-times)
          (push (resume-bench--time (lambda () (magent-session-read-file store-file)))
                store-times))
        (message "magent-session-read-file, %d rounds, alternating, GC included (ms):" rounds)
        (message "  magent's own schema-6 file:  %s  median %.0f"
                 (mapconcat (lambda (s) (format "%.0f" (* 1000 s))) (reverse own-times) " ")
                 (* 1000 (resume-bench--median own-times)))
        (message "  through magent-store-mode:   %s  median %.0f"
                 (mapconcat (lambda (s) (format "%.0f" (* 1000 s))) (reverse store-times) " ")
                 (* 1000 (resume-bench--median store-times)))
        (message "  ratio (store / own): %.2f (target: at most 1.00)"
                 (/ (resume-bench--median store-times) (resume-bench--median own-times))))
    (ignore-errors (magent-store-stop))
    (delete-directory tmp t)))

;;; resume-bench.el ends here
