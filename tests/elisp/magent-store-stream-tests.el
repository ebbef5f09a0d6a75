;;; magent-store-stream-tests.el --- A stream long enough for replies to cross it  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The backend may hold a tick's reply for up to a second, and a reply
;; recycles the batch vector it acknowledges while the next batch fills.
;; A short stream never has a reply arrive while chunks are queued: this
;; one streams for several seconds, as a long answer does, and checks
;; that it did, and that every chunk is stored once, in order.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)

;; A machine's speed decides whether a reply happens to land between
;; two timed chunks, so the test makes it happen: it sends a batch,
;; queues more chunks, then waits for that batch's reply without running
;; timers.  Each round's reply arrives while chunks are queued.
(defconst magent-store-test--stream-rounds 6
  "How many replies the long stream has cross queued chunks.")

(ert-deftest magent-store-replies-arriving-mid-stream-lose-no-chunk ()
  "Replies that arrive while chunks are queued: every chunk once, in order."
  (magent-store-test--with-backend
    (let* ((session (magent-store-test--session "s-long"))
           (connection (magent-store-backend-connection magent-store-current-backend))
           (crossed 0)
           (replies 0)
           (next 0)
           (sent nil)
           (queue (lambda (n)
                    (dotimes (_ n)
                      (let ((chunk (format "%s%d|" (nth (% next 40)
                                                        magent-store-test--chunks)
                                           next)))
                        (push chunk sent)
                        (cl-incf next)
                        (magent-store-append-item-content "s-long" "item-1" chunk)
                        (magent-store-request-flush "s-long")))))
           (magent-store-flushed-function
            (lambda (_sent _numbered _reply)
              (cl-incf replies)
              (when (> (magent-store--session-fill session) 0)
                (cl-incf crossed)))))
      (dotimes (_ magent-store-test--stream-rounds)
        (funcall queue 40)
        (magent-store--tick session)      ; the batch goes out as a tick
        (should (= (magent-store--session-fill session) 0))
        (funcall queue 40)                ; and the next one fills meanwhile
        (let ((seen replies)
              (deadline (+ (float-time) 20)))
          ;; An integer JUST-THIS-ONE: no timer runs, so nothing sends the
          ;; queued chunks before the reply is in.
          (while (and (= replies seen) (< (float-time) deadline))
            (accept-process-output connection 0.05 nil 1))
          (should (> replies seen))))
      ;; Then a stream on real timers, as a long answer arrives.
      (let ((chunks (let (out)
                      (dotimes (_ 200)
                        (push (format "t%d|" next) out)
                        (cl-incf next))
                      (nreverse out))))
        (setq sent (append (reverse chunks) sent))
        (magent-store-test--stream "s-long" chunks 0.005))
      (should (= (magent-store-flush "s-long") (+ 3 next)))
      (should (>= crossed magent-store-test--stream-rounds))
      (should (equal (magent-store-test--content (magent-store-load "s-long"))
                     (apply #'concat (reverse sent)))))))

;; A reply runs in the connection's process filter; printing the next
;; batch there, megabytes at times, would hold up reading the replies
;; after it.  So the reply only schedules the send.
(ert-deftest magent-store-reply-sends-nothing-from-the-process-filter ()
  "A reply to a batch sends the entries queued meanwhile, but not from the filter."
  (magent-store-test--with-backend
    (let* ((session (magent-store-test--session "s-filter"))
           (connection (magent-store-backend-connection magent-store-current-backend))
           (sent-in-filter 0)
           (replies 0)
           (magent-store-flushed-function
            (lambda (&rest _) (cl-incf replies)))
           ;; A batch sent counts a flush of the session.
           (filter (lambda (orig &rest args)
                     (let ((before (magent-store--session-flushes session)))
                       (apply orig args)
                       (cl-incf sent-in-filter
                                (- (magent-store--session-flushes session)
                                   before))))))
      (advice-add 'magent-store--filter :around filter)
      (unwind-protect
          (progn
            (magent-store-append-item-content "s-filter" "item-1" "one|")
            (magent-store--tick session)
            (magent-store-append-item-content "s-filter" "item-1" "two|")
            (magent-store-request-flush "s-filter")
            (should (> (magent-store--session-fill session) 0))
            (let ((deadline (+ (float-time) 20)))
              ;; No timer runs while this waits: the reply alone is seen.
              (while (and (= replies 0) (< (float-time) deadline))
                (accept-process-output connection 0.05 nil 1)))
            (should (= replies 1))
            (should (= sent-in-filter 0))
            ;; Once timers run, the queued chunk goes out by itself.
            (let ((deadline (+ (float-time) 20)))
              (while (and (or (> (magent-store--session-fill session) 0)
                              (magent-store--session-inflight session))
                          (< (float-time) deadline))
                (accept-process-output nil 0.05)))
            (should (= replies 2))
            (should (= sent-in-filter 0)))
        (advice-remove 'magent-store--filter filter))
      (should (equal (magent-store-test--content (magent-store-load "s-filter"))
                     "one|two|")))))

(provide 'magent-store-stream-tests)
;;; magent-store-stream-tests.el ends here
