;;; magent-store-test-timing-cost.el --- What timing costs Emacs, byte-compiled  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Measures, with the shim byte-compiled as users run it, what recording
;; costs Emacs next to the chunk path it must not exceed:
;;
;;   emacs --batch -Q -L elisp -L tests/elisp -l magent-store-test-timing-cost \
;;         -f magent-store-test-timing-cost-run
;;
;; Per call, best of 5 runs: a chunk through `magent-store-mode's advice
;; (magent's append-item-content), a lifecycle event through the sink, a
;; `magent-store-record-timing', the timing advice on magent's
;; apply-event, and what a record adds to printing a tick.  Time is
;; measured only here; the ERT test
;; `magent-store-timing-recording-allocates-one-small-record' pins what
;; recording allocates, which needs no clock.

;;; Code:

(require 'cl-lib)
(require 'bytecomp)
(require 'magent-store-test-backend)

(defconst magent-store-test-timing-cost--checkout
  (expand-file-name ".." (file-name-directory
                          (directory-file-name
                           (file-name-directory (or load-file-name
                                                    buffer-file-name)))))
  "The checkout this file belongs to.")

(defun magent-store-test-timing-cost--load-compiled ()
  "Byte-compile the shim into a temporary directory and load it from there."
  (let ((dir (make-temp-file "magent-store-elc-" t)))
    (dolist (name '("magent-store.el" "magent-store-timing.el"))
      (copy-file (expand-file-name (concat "elisp/" name)
                                   magent-store-test-timing-cost--checkout)
                 (expand-file-name name dir)))
    (add-to-list 'load-path dir)
    (let ((byte-compile-verbose nil)
          (inhibit-message t))
      (byte-compile-file (expand-file-name "magent-store.el" dir))
      (byte-compile-file (expand-file-name "magent-store-timing.el" dir)))
    (load (expand-file-name "magent-store.elc" dir) nil t)
    (load (expand-file-name "magent-store-timing.elc" dir) nil t)
    dir))

(defun magent-store-test-timing-cost-run ()
  "Print the costs; see the Commentary."
  (let ((dir (magent-store-test-timing-cost--load-compiled)))
    (require 'magent-store-timing-tests)
    (byte-compile 'magent-store-timing-test--per-call-us)
    (dolist (f '(magent-agent-loop-apply-event magent-agent-loop-event-context
                                               magent-llm-event-type
                                               magent-thread-append-item-content
                                               magent-thread-append-event
                                               magent-thread-session-id
                                               magent-thread-item-id))
      (byte-compile f))
    (let ((magent-store-test-python
           (expand-file-name ".venv/bin/magent-store"
                             magent-store-test-timing-cost--checkout))
          (n 1000))
      (magent-store-timing-test--with-backend
        (let* ((thread (list :session-id "s-cost" :scope 'global))
               (item (list :id "turn-cost-a"))
               (byte-compile-warnings nil)
               (ctx (magent-lifecycle-events-context-create :turn-id "turn-cost"))
               (loop (list :context ctx))
               (event (list :type 'text-delta :text "x"))
               (start (list :type 'tool-call-start :time 1.0 :context ctx
                            :turn-id "turn-cost" :subagent-id nil :call-id "c1"
                            :tool-name "bash" :args '(:command "ls")))
               (end (list :type 'tool-call-end :time 2.0 :context ctx
                          :turn-id "turn-cost" :subagent-id nil :call-id "c1"
                          :tool-name "bash" :status 'completed :result "out"))
               (chunk-fn (byte-compile
                          (lambda () (magent-thread-append-item-content
                                      thread item "a streamed chunk of text"))))
               (apply-fn (byte-compile
                          (lambda () (magent-agent-loop-apply-event loop event))))
               (sink-fn (byte-compile
                         (lambda () (magent-store-timing--sink start)
                           (magent-store-timing--sink end))))
               (record-fn (byte-compile
                           (lambda () (magent-store-record-timing
                                       'acp-update :duration-ms 1.5 :count 1))))
               (bare-chunk (magent-store-timing-test--per-call-us n chunk-fn))
               (bare-apply (magent-store-timing-test--per-call-us n apply-fn)))
          (magent-store-mode 1)
          (magent-store-open "s-cost")
          (magent-thread-append-event
           thread (magent-store-test-timing-standin--event "thread-started"))
          (magent-store-test-timing-standin--journal-turn thread "turn-cost")
          (let* ((chunk (- (magent-store-timing-test--per-call-us n chunk-fn) bare-chunk))
                 (apply (- (magent-store-timing-test--per-call-us n apply-fn) bare-apply))
                 (sink (/ (magent-store-timing-test--per-call-us (/ n 2) sink-fn) 2))
                 (record (magent-store-timing-test--per-call-us n record-fn))
                 (chunks (make-list 40 (list "item-1" "a streamed chunk of text"
                                             nil 1764400000000)))
                 (records (let (l)
                            (dotimes (i 100)
                              (push (list 'tool-call-start "turn-cost"
                                          (+ i 1764400000000000) :call i :agent 1)
                                    l))
                            l))
                 (print-fn (lambda (extra)
                             (byte-compile
                              `(lambda ()
                                 (magent-store--with-send-buffer
                                   (magent-store-print
                                    (list 'call 1 'tick
                                          (list "s" ',chunks ,@extra))))))))
                 (plain (magent-store-timing-test--per-call-us
                         200 (funcall print-fn nil)))
                 (riding (magent-store-timing-test--per-call-us
                          200 (funcall print-fn `(',records)))))
            (princ (format "Emacs %s, byte-compiled, per call (best of 5 x %d):
  chunk through magent-store-mode's advice  %.2f us
  lifecycle event through the sink          %.2f us
  magent-store-record-timing                %.2f us
  timing advice on a provider event         %.2f us
  a record riding a tick (printing)         %.2f us\n"
                           emacs-version n chunk sink record apply
                           (/ (- riding plain) 100)))))))
    (delete-directory dir t)))

(provide 'magent-store-test-timing-cost)
;;; magent-store-test-timing-cost.el ends here
